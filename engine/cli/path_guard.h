// What a command writes never destroys what it reads. Every path flag of
// every command passes through check_command_paths (cli/main.cc calls it
// once, after parsing and before the command runs), so a new command's
// outputs are guarded by naming its flags in the role table (path_guard.cc),
// not by a check of its own.
//
// Refused, each naming both flags and the way out:
//  * an output that is an input of the same command (same file after
//    resolving ".", "..", symbolic and hard links): `train --trace
//    corpus.txt` would overwrite the training data, `plan --out model.json`
//    the model it read;
//  * two outputs of one command on one file;
//  * an output inside another run's checkpoint folder (one holding a
//    checkpoint manifest or lock that is not this command's --checkpoint): a
//    foreign file there makes resuming that run refuse the folder;
//  * an empty output path.
// Replacing an output is atomic (core/input_file.h, write_output_file).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace CLI {
class App;
}

namespace meshtrain {

enum class PathRole {
  input,           // read; a missing file is the reader's error, not this one's
  input_if_file,   // a preset name or a file (--model, --cluster): a file only if one exists there
  output,          // written (or appended to)
  checkpoint_dir,  // read and written: a folder only the checkpoint writes into
};

struct PathFlag {
  std::string flag;  // "--trace", as the user typed it
  std::string path;
  PathRole role = PathRole::input;
};

Status check_paths(const std::vector<PathFlag>& flags);

// The path flags a parsed subcommand was given (its options named in the
// role table), then check_paths of them.
std::vector<PathFlag> path_flags(const CLI::App& command);
Status check_command_paths(const CLI::App& command);

}  // namespace meshtrain
