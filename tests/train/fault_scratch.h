// What the fault-injection tests (threads and MPI) share: the CLI tests'
// scratch files and training text (tests/tracing/cli_scratch.h), the
// metrics lines a run wrote, and the check that a run resumes from its last
// checkpoint.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

namespace meshtrain::testing {

inline std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// `command --resume` succeeds and trains steps first_step..last_step: the
// checkpoint before first_step was intact.
inline void check_resumes(const std::string& command, int first_step, int last_step) {
  const auto metrics = trace_scratch("resumed.jsonl");
  MeshtrainRun resumed = run_meshtrain(command + " --resume --metrics " + metrics.string());
  INFO(resumed.out);
  CHECK(resumed.status == 0);
  const auto lines = metrics_lines(metrics);
  REQUIRE(lines.size() == static_cast<std::size_t>(last_step - first_step + 1));
  CHECK(lines.front()["step"] == first_step);
}

}  // namespace meshtrain::testing
