// The meshtrain subcommands. Each registers its flags on a CLI11 subcommand
// and returns the function that runs it once the command line is parsed.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

#include "core/status.h"

namespace meshtrain {

struct Command {
  CLI::App* app = nullptr;      // the registered subcommand
  std::function<Status()> run;  // runs it; called after parsing
};

Command add_info_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_simulate_command(CLI::App& app);
Command add_goodput_command(CLI::App& app);
Command add_plan_command(CLI::App& app);  // engine/planner/
Command add_calibrate_command(CLI::App& app);  // engine/calibrate/
Command add_tokenize_command(CLI::App& app);
Command add_plot_command(CLI::App& app);       // engine/pictures/
Command add_compare_command(CLI::App& app);
Command add_generate_command(CLI::App& app);  // engine/generate/
Command add_export_command(CLI::App& app);  // engine/export/

}  // namespace meshtrain
