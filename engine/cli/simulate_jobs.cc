#include "engine/cli/simulate_jobs.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/simulation/shared_fabric.h"
#include "engine/simulation/variation.h"

namespace meshtrain {

Status run_simulate_jobs(const std::vector<std::string>& files, const SimulateOptions& options, int num_gpus,
                         bool json) {
  std::vector<JobSpec> jobs;
  for (const std::string& f : files) {
    MT_ASSIGN(JobSpec j, load_job(f));
    jobs.push_back(std::move(j));
  }
  MT_ASSIGN(SharedFabricResult r, simulate_shared(std::move(jobs), options, num_gpus));
  if (json) {
    nlohmann::json out = {{"cluster", options.cluster.name},
                          {"gpus", r.num_gpus},
                          {"simulator_wall_s", r.simulator_wall_s},
                          {"jobs", nlohmann::json::array()},
                          {"what_ifs", describe_variation(options.variation)}};
    for (const SharedJobResult& j : r.jobs)
      out["jobs"].push_back({{"name", j.name},
                             {"gpus", j.gpus},
                             {"first_gpu", j.first_gpu},
                             {"last_gpu", j.last_gpu},
                             {"iterations", j.iterations},
                             {"alone_iteration_s", j.alone_s},
                             {"shared_iteration_s", j.shared_s},
                             {"slowdown", j.slowdown()}});
    fmt::print("{}\n", out.dump(2));
    return {};
  }
  fmt::print("{} jobs on {} x {} ({}), full fidelity, each also alone on the same GPUs\n", r.jobs.size(),
             r.num_gpus, options.cluster.device.name, options.cluster.name);
  fmt::print("  {:<16} {:>6} {:>11} {:>6} {:>12} {:>12} {:>9}\n", "job", "GPUs", "placed", "iters", "alone s/it",
             "shared s/it", "slowdown");
  for (const SharedJobResult& j : r.jobs)
    fmt::print("  {:<16} {:>6} {:>11} {:>6} {:>12.4f} {:>12.4f} {:>8.3f}x\n", j.name, j.gpus,
               fmt::format("{}-{}", j.first_gpu, j.last_gpu), j.iterations, j.alone_s, j.shared_s, j.slowdown());
  // The link what-ifs apply to the shared fabric, so to every job: listed as a single run lists them.
  for (const std::string& what_if : describe_variation(options.variation)) fmt::print("what-if          {}\n", what_if);
  fmt::print("simulator        {:.2f} s\n", r.simulator_wall_s);
  return {};
}

}  // namespace meshtrain
