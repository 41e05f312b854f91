// Several training jobs on one simulated cluster, contending for its links
// (`meshtrain simulate --job A.json --job B.json`).
//
// Each job is a model, a plan and a placement of its ranks on the cluster's
// GPUs. All jobs run in full fidelity (every rank's ops and flows,
// simulation.h) on one network, so where their traffic crosses (a leaf's
// uplinks, a spine, shared NICs when jobs share nodes) they slow each other
// down. Each job is also simulated alone on the same cluster and placement;
// its slowdown is its shared time over its alone time.
//
// Jobs of different lengths: a job that finishes its iteration early would
// leave the other alone for the rest of it, hiding the contention. So each
// job runs k iterations back to back, k = round(longest alone iteration /
// its own alone iteration), at most `max_iterations`, and its time is per
// iteration, alone and shared alike; the jobs then overlap for most of the
// longest job's iteration.
//
// A job file:
//   {"name": "A",                      optional: the file's stem
//    "model": "gpt3-175b",             a preset, a model file (relative to the job file), or a model object
//    "plan": {"tp": 8, "pp": 4, ...},  plan fields (engine/plan/plan.h), or a plan file
//    "gpus": "0-255"}                  optional: GPU of each rank, as ranges "0-127,256-383" or a list;
//                                      by default the GPUs after the previous job's
// Unknown fields are errors.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/plan/plan.h"
#include "engine/simulation/simulation.h"
#include "models/model_spec.h"

namespace meshtrain {

struct JobSpec {
  std::string name;
  ModelSpec model;
  Plan plan;
  std::vector<int> gpus;  // by rank; empty: after the previous job's
};

// `dir` resolves relative model and plan file names.
Result<JobSpec> job_from_json(const nlohmann::json& j, const std::string& default_name, const std::string& dir);
Result<JobSpec> load_job(const std::string& path);
// "0-3,8-11" -> {0, 1, 2, 3, 8, 9, 10, 11}.
Result<std::vector<int>> parse_gpu_ranges(const std::string& text);

struct SharedJobResult {
  std::string name;
  int first_gpu = 0, last_gpu = 0, gpus = 0;
  int iterations = 1;
  double alone_s = 0, shared_s = 0;  // per iteration
  double slowdown() const { return alone_s > 0 ? shared_s / alone_s : 0; }
};

struct SharedFabricResult {
  int num_gpus = 0;
  std::vector<SharedJobResult> jobs;
  double simulator_wall_s = 0;  // all runs, alone and shared
};

// Places the jobs (filling in default placements), checks that no GPU is
// used twice and that the cluster holds them (`num_gpus` 0: the highest GPU
// used + 1), and simulates each alone and all together.
Result<SharedFabricResult> simulate_shared(std::vector<JobSpec> jobs, const SimulateOptions& options,
                                           int num_gpus = 0, int max_iterations = 8);

}  // namespace meshtrain
