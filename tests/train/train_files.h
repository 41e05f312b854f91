// What the CLI training tests of this folder share: a fresh scratch
// directory per test process, the --metrics file read back, and a run
// stopped at a step and resumed from its checkpoint.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
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

// `args` trained up to --stop-at `step`, checkpointed into dir, its metrics
// written to metrics.
inline void run_stopped_at(const std::string& args, int step, const std::filesystem::path& dir,
                           const std::filesystem::path& metrics) {
  REQUIRE(run_meshtrain(args + " --stop-at " + std::to_string(step) + " --checkpoint " + dir.string() + " --metrics " +
                        metrics.string()).status == 0);
}

// `args` resumed from the checkpoint in dir, its metrics appended to metrics.
inline void run_resumed(const std::string& args, const std::filesystem::path& dir,
                        const std::filesystem::path& metrics) {
  MeshtrainRun resumed = run_meshtrain(args + " --checkpoint " + dir.string() + " --resume --metrics " + metrics.string());
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
}

// The metrics files once and twice hold as many steps, with the same losses.
inline void check_same_losses(const std::filesystem::path& once, const std::filesystem::path& twice) {
  const auto a = read_metrics(once), b = read_metrics(twice);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i]["loss"] == b[i]["loss"]);
}

}  // namespace meshtrain::testing
