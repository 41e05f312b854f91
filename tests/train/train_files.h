// What the CLI training tests of this folder share: a fresh scratch
// directory per test process, and the --metrics file read back.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/training/temp_dir.h"

namespace meshtrain::testing {

// <temp>/meshtrain-<suite>-<pid>/<name>, empty.
inline std::filesystem::path train_scratch(const std::string& suite, const std::string& name) {
  std::filesystem::path p = scratch_path(suite, name);
  std::filesystem::create_directories(p);
  return p;
}

// One JSON object per line, as --metrics writes them.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace meshtrain::testing
