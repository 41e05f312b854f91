// What the fault-injection tests (threads and MPI) share: the CLI tests'
// scratch files and training text (tests/tracing/cli_scratch.h), the
// training command (and its checkpointed form), the metrics lines a run
// wrote, and the checks that a run fails naming its fault, that rank 1 is
// reported as the straggler, and that a run resumes from its last checkpoint.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

namespace meshtrain::testing {

// `train` of the tiny model on the training text, as every fault test runs
// it, with flags.
inline std::string fault_train(const std::string& flags) {
  return "train --data " + training_text() + " --model tiny --seq-len 64 --micro-batch 4 --lr 1e-3 --warmup 1 --quiet" +
         flags;
}

inline std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// fault_train with two data-parallel ranks over 6 steps, checkpointing every 2 into scratch
// directory `name`, each collective timing out after 2 s: the runs whose faults resume.
inline std::string checkpointed_train(const std::string& name) {
  return fault_train(" --dp 2 --steps 6 --checkpoint " + trace_scratch(name).string() +
                     " --checkpoint-every 2 --comm-timeout 2");
}

// The metrics lines of fault_train(flags), written to scratch file `name`; the run must succeed.
inline std::vector<nlohmann::json> metrics_of_run(const std::string& name, const std::string& flags) {
  const auto metrics = trace_scratch(name);
  MeshtrainRun r = run_meshtrain(fault_train(flags + " --metrics " + metrics.string()));
  INFO(r.out);
  REQUIRE(r.status == 0);
  return metrics_lines(metrics);
}

// `command` fails (status non-zero) and its output matches `names` (what it
// says of the fault).
template <class Matcher>
void check_fails_naming(const std::string& command, const Matcher& names) {
  MeshtrainRun r = run_meshtrain(command);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK_THAT(r.out, names);
}

// A metrics line of a step after the slowdown of rank 1 began: the straggler
// report names rank 1, computing more than twice the median. The callers slow
// rank 1 32x against the lower median (rank 0's compute): a ratio in one run,
// with room for rank 0's compute to be inflated up to 16x by a loaded machine
// (at 8x a busy 2-core run failed once).
inline void check_rank_1_straggles(const nlohmann::json& j) {
  CHECK(j["slowest_rank"] == 1);
  CHECK(j["slowest_compute_s"].get<double>() > 2 * j["median_compute_s"].get<double>());
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
