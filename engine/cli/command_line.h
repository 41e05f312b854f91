// What the command line offers beyond the subcommands' own flags: the
// version, help that shows every default and one example per subcommand,
// and parse errors that name a mistyped subcommand or flag and the nearest
// real one, instead of CLI11's generic "a subcommand is required".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace meshtrain {

// "0.1 (git f64b820-dirty)": the CMake project version and, when the source
// was a git checkout at configure time, `git describe`.
std::string meshtrain_version();

// Before any subcommand is added: --version, and every option's default
// captured so that --help prints it.
void configure_app(CLI::App& app);

// After the subcommands are added: each one's help ends with an example
// that runs as written (docs/commands.md has the same ones).
void add_examples(CLI::App& app);

// The example of subcommand `name` ("" where it has none).
std::string command_example(const std::string& name);

// Why `args` (argv without the program name) did not parse, when the cause is
// a word that is not a subcommand or a flag the subcommand does not have;
// nullopt when every word is known (then CLI11's own message stands).
std::optional<std::string> explain_unknown_words(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace meshtrain
