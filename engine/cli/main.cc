// meshtrain: the one executable. Errors come back as values and are turned
// into a message and an exit code here, and only here.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "engine/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: simulation-first hybrid-parallel transformer training"};
  app.require_subcommand(1);
  std::vector<meshtrain::Command> commands = {meshtrain::add_info_command(app), meshtrain::add_train_command(app),
                                              meshtrain::add_simulate_command(app),
                                              meshtrain::add_goodput_command(app),
                                              meshtrain::add_calibrate_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    auto status = command.run();
    if (!status.ok()) {
      std::fprintf(stderr, "meshtrain %s: error: %s\n", command.app->get_name().c_str(),
                   status.error().message().c_str());
      return 1;
    }
  }
  return 0;
}
