// meshtrain: the one executable. Errors come back as values and are turned
// into a message and an exit code here, and only here.
#include <cstdio>
#include <exception>
#include <new>

#include <CLI/CLI.hpp>

#include "engine/cli/command_line.h"
#include "engine/cli/commands.h"
#include "engine/cli/path_guard.h"
#include "engine/training/stop_request.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: simulation-first hybrid-parallel transformer training"};
  meshtrain::configure_app(app);
  app.require_subcommand(1);
  std::vector<meshtrain::Command> commands = {meshtrain::add_info_command(app), meshtrain::add_train_command(app),
                                              meshtrain::add_simulate_command(app),
                                              meshtrain::add_goodput_command(app),
                                              meshtrain::add_plan_command(app),
                                              meshtrain::add_calibrate_command(app),
                                              meshtrain::add_tokenize_command(app),
                                              meshtrain::add_plot_command(app),
                                              meshtrain::add_compare_command(app),
                                              meshtrain::add_generate_command(app),
                                              meshtrain::add_export_command(app)};
  meshtrain::add_examples(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A mistyped subcommand or flag is the cause to name, before what CLI11 noticed first.
    const auto unknown = meshtrain::explain_unknown_words(app, std::vector<std::string>(argv + 1, argv + argc));
    if (!unknown) return app.exit(e);
    std::fprintf(stderr, "%s\n", unknown->c_str());
    return e.get_exit_code();
  }
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    // Errors are values; an exception here is a bug or the process out of
    // memory, and still ends with a message rather than an abort.
    // What the command writes must not destroy what it reads: one check for every command.
    meshtrain::Status status = meshtrain::check_command_paths(*command.app);
    try {
      if (status.ok()) status = command.run();
    } catch (const std::bad_alloc&) {
      status = meshtrain::make_error("out of memory; use a smaller model, batch or sequence, or more ranks");
    } catch (const std::exception& e) {
      status = meshtrain::make_error("internal error (please report it): {}", e.what());
    }
    if (!status.ok()) {
      std::fprintf(stderr, "meshtrain %s: error: %s\n", command.app->get_name().c_str(),
                   status.error().message().c_str());
      // A run stopped by a signal exits as a shell reports one (SIGTERM: 143).
      return meshtrain::stop_signal() != 0 ? 128 + meshtrain::stop_signal() : 1;
    }
  }
  return 0;
}
