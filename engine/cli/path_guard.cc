#include "engine/cli/path_guard.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// Every option of any command that names a file or folder. An option not
// listed is not a path (a list of numbers, a preset's name, a mode).
const std::map<std::string, PathRole>& roles() {
  static const std::map<std::string, PathRole> table = {
      {"--data", PathRole::input},          {"--plan", PathRole::input},
      {"--calibration", PathRole::input},   {"--init-from", PathRole::input},
      {"--tokenizer", PathRole::input},     {"--input", PathRole::input},
      {"--job", PathRole::input},           {"--model", PathRole::input_if_file},
      {"--cluster", PathRole::input_if_file}, {"--metrics", PathRole::output},
      {"--trace", PathRole::output},        {"--out", PathRole::output},
      {"--svg", PathRole::output},          {"--checkpoint", PathRole::checkpoint_dir},
  };
  return table;
}

// The path with ".", ".." and symbolic links resolved as far as it exists.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

bool same_file(const PathFlag& a, const PathFlag& b) {
  std::error_code ec;
  if (fs::exists(a.path, ec) && fs::exists(b.path, ec)) return fs::equivalent(a.path, b.path, ec) && !ec;
  return resolved(a.path) == resolved(b.path);
}

// A folder that holds a checkpoint: its manifest or the lock a writer holds.
bool is_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "manifest.json", ec) || fs::is_regular_file(dir / "meshtrain.lock", ec);
}

// The checkpoint folder of another run that `path` lies in, if any: a parent
// holding a checkpoint that is not this command's own --checkpoint (the
// checkpoint writer keeps this run's metrics and trace beside its own files).
std::optional<fs::path> checkpoint_holding(const std::string& path, const std::vector<PathFlag>& flags) {
  const fs::path p = resolved(path);
  for (fs::path dir = p.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    const bool own = std::any_of(flags.begin(), flags.end(), [&](const PathFlag& f) {
      return f.role == PathRole::checkpoint_dir && resolved(f.path) == dir;
    });
    if (!own && is_checkpoint_dir(dir)) return dir;
    if (dir == dir.root_path()) break;
  }
  return std::nullopt;
}

bool reads(const PathFlag& f) {
  std::error_code ec;
  if (f.role == PathRole::input) return true;
  return f.role == PathRole::input_if_file && fs::is_regular_file(f.path, ec);
}

}  // namespace

Status check_paths(const std::vector<PathFlag>& flags) {
  for (std::size_t i = 0; i < flags.size(); ++i) {
    const PathFlag& out = flags[i];
    if (out.role != PathRole::output) continue;
    if (out.path.empty()) return make_error("{} is empty; name the file to write", out.flag);
    for (const PathFlag& in : flags)
      if (reads(in) && same_file(out, in))
        return make_error("{} '{}' is the file {} reads ('{}'): writing it would destroy that input; pass "
                          "another {} path",
                          out.flag, out.path, in.flag, in.path, out.flag);
    for (std::size_t j = 0; j < i; ++j)
      if (flags[j].role == PathRole::output && same_file(out, flags[j]))
        return make_error("{} and {} are one file ('{}'): each output needs its own path", flags[j].flag, out.flag,
                          out.path);
    if (const auto dir = checkpoint_holding(out.path, flags))
      return make_error("{} '{}' lies inside the checkpoint folder '{}', which holds only what the checkpoint "
                        "writes for its own run (another run's file there would make resuming it refuse the "
                        "folder); write {} outside it",
                        out.flag, out.path, dir->string(), out.flag);
  }
  return ok_status();
}

// Positional arguments that name files: `plot METRICS`, `compare PLAN...`.
const std::map<std::string, PathRole>& positional_roles() {
  static const std::map<std::string, PathRole> table = {{"metrics", PathRole::input}, {"plans", PathRole::input}};
  return table;
}

std::vector<PathFlag> path_flags(const CLI::App& command) {
  std::vector<PathFlag> flags;
  for (const CLI::Option* opt : command.get_options()) {
    if (opt->count() == 0) continue;
    if (opt->get_lnames().empty()) {  // a positional argument
      const auto it = positional_roles().find(opt->get_name());
      if (it != positional_roles().end())
        for (const std::string& value : opt->results()) flags.push_back({it->first, value, it->second});
      continue;
    }
    for (const std::string& name : opt->get_lnames()) {
      const auto it = roles().find("--" + name);
      if (it == roles().end()) continue;
      for (const std::string& value : opt->results()) flags.push_back({it->first, value, it->second});
      break;
    }
  }
  // A command's own subcommands (`tokenize encode`) take their flags with it.
  for (const CLI::App* sub : command.get_subcommands()) {
    std::vector<PathFlag> more = path_flags(*sub);
    flags.insert(flags.end(), more.begin(), more.end());
  }
  return flags;
}

Status check_command_paths(const CLI::App& command) { return check_paths(path_flags(command)); }

}  // namespace meshtrain
