#include "engine/simulation/shared_fabric.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/bounded.h"
#include "core/json_input.h"
#include "engine/step/step_engine.h"

namespace meshtrain {

namespace {

// A name that is not a preset is a file, relative to the job file's folder.
std::string resolve(const std::string& name, const std::string& dir) {
  const std::filesystem::path p(name);
  if (p.is_absolute() || dir.empty()) return name;
  const std::filesystem::path beside = std::filesystem::path(dir) / p;
  return std::filesystem::exists(beside) ? beside.string() : name;
}

struct Run {
  std::vector<double> per_iteration;  // by job
};

Result<Run> run_jobs(const std::vector<const JobSpec*>& jobs, const std::vector<int>& iterations,
                     const SimulateOptions& options, int num_gpus) {
  std::vector<SimJob> sim_jobs;
  for (const JobSpec* j : jobs) sim_jobs.push_back(simulation_job(j->plan, true, {}, j->gpus));
  MT_ASSIGN(auto cluster,
            SimCluster::create_jobs(options.cluster, num_gpus, std::move(sim_jobs), simulation_options(options, true)));
  for (std::size_t i = 0; i < jobs.size(); ++i)
    MT_TRY(issue_iterations(*cluster, static_cast<int>(i), jobs[i]->model, jobs[i]->plan, options, iterations[i])
               .context(fmt::format("job '{}'", jobs[i]->name)));
  MT_ASSIGN(SimReport report, cluster->run());
  Run out;
  for (std::size_t i = 0; i < jobs.size(); ++i) out.per_iteration.push_back(report.jobs[i].iteration_s / iterations[i]);
  return out;
}

}  // namespace

Result<std::vector<int>> parse_gpu_ranges(const std::string& text) {
  // GPU ids are those of a cluster of at most kMaxWorldSize GPUs; so is their count.
  const IntRange kGpuId{0, kMaxWorldSize - 1};
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = std::string_view(text).substr(start, comma - start);
    const std::size_t dash = item.find('-');
    auto bad = [&](const Error& e) {
      return make_error("GPUs '{}': write ranges such as 0-127,256-383 ('{}': {})", text, item, e.message());
    };
    auto lo = parse_int("a GPU id", item.substr(0, dash), kGpuId);
    if (!lo.ok()) return bad(lo.error());
    auto hi = dash == std::string_view::npos ? lo : parse_int("a GPU id", item.substr(dash + 1), kGpuId);
    if (!hi.ok()) return bad(hi.error());
    if (*hi < *lo)
      return make_error("GPUs '{}': write ranges such as 0-127,256-383 ('{}' runs backwards)", text, item);
    if (static_cast<std::int64_t>(out.size()) + (*hi - *lo + 1) > kMaxWorldSize)
      return make_error("GPUs '{}': more than {} GPUs", text, kMaxWorldSize);
    for (std::int64_t g = *lo; g <= *hi; ++g) out.push_back(static_cast<int>(g));
    start = comma + 1;
  }
  return out;
}

Result<JobSpec> job_from_json(const nlohmann::json& j, const std::string& default_name, const std::string& dir) {
  MT_ASSIGN(const JsonFields f,
            JsonFields::of(j, "job field", "a job must be a JSON object with model, plan and optionally name and gpus"));
  MT_TRY(f.check_known({"name", "model", "plan", "gpus"}));
  JobSpec job;
  job.name = default_name;
  MT_TRY(f.get_string("name", job.name));
  if (!f.has("model")) return make_error("job '{}': needs a model (a preset, a model file or an object)", job.name);
  if (f.at("model").is_string()) {
    MT_ASSIGN(job.model, load_model(resolve(f.at("model").get<std::string>(), dir)));
  } else {
    MT_ASSIGN(job.model, model_from_json(f.at("model")));
  }
  PlanOverrides o;
  if (!f.has("plan")) return make_error("job '{}': needs a plan (plan fields or a plan file)", job.name);
  if (f.at("plan").is_string()) {
    MT_ASSIGN(o, plan_overrides_from_file(resolve(f.at("plan").get<std::string>(), dir)));
  } else {
    MT_ASSIGN(o, plan_overrides_from_json(f.at("plan")));
  }
  MT_ASSIGN(job.plan, apply_overrides(Plan{}, o));
  MT_TRY(validate_plan(job.plan, job.model).context(fmt::format("job '{}'", job.name)));
  if (f.has("gpus")) {
    const nlohmann::json& g = f.at("gpus");
    if (g.is_string()) {
      MT_ASSIGN(job.gpus, parse_gpu_ranges(g.get<std::string>()));
    } else if (g.is_array() && g.size() <= static_cast<std::size_t>(kMaxWorldSize)) {
      for (const nlohmann::json& id : g) {
        MT_ASSIGN(const std::int64_t gpu, json_int(id, f.name("gpus") + " entry", {0, kMaxWorldSize - 1}));
        job.gpus.push_back(static_cast<int>(gpu));
      }
    } else {
      return make_error("job '{}': gpus must be ranges (\"0-127\") or a list of at most {} GPU ids", job.name,
                        kMaxWorldSize);
    }
    if (static_cast<int>(job.gpus.size()) != job.plan.world_size())
      return make_error("job '{}': {} GPUs given for a plan of {} ranks (tp·pp·dp·cp)", job.name, job.gpus.size(),
                        job.plan.world_size());
  }
  return job;
}

Result<JobSpec> load_job(const std::string& path) {
  MT_ASSIGN(const nlohmann::json j, load_json_file(path, "job file"));
  const std::filesystem::path p(path);
  auto job = job_from_json(j, p.stem().string(), p.parent_path().string());
  return std::move(job.context(fmt::format("job file '{}'", path)));
}

Result<SharedFabricResult> simulate_shared(std::vector<JobSpec> jobs, const SimulateOptions& options, int num_gpus,
                                           int max_iterations) {
  if (jobs.empty()) return make_error("no jobs to simulate");
  if (!options.variation.stragglers.empty())
    return make_error("stragglers name ranks of one job; with several jobs give link what-ifs only");
  const auto wall_start = std::chrono::steady_clock::now();
  int next = 0, highest = -1;
  std::vector<int> owner;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    JobSpec& j = jobs[i];
    MT_TRY(StepEngine::supports(j.plan).context(fmt::format("job '{}'", j.name)));
    if (j.gpus.empty())
      for (int r = 0; r < j.plan.world_size(); ++r) j.gpus.push_back(next + r);
    for (int g : j.gpus) {
      if (g < 0) return make_error("job '{}': GPU {} is negative", j.name, g);
      if (static_cast<int>(owner.size()) <= g) owner.resize(static_cast<std::size_t>(g) + 1, -1);
      if (owner[static_cast<std::size_t>(g)] >= 0)
        return make_error("GPU {} is placed in job '{}' and job '{}'", g,
                          jobs[static_cast<std::size_t>(owner[static_cast<std::size_t>(g)])].name,
                          j.name);
      owner[static_cast<std::size_t>(g)] = static_cast<int>(i);
      highest = std::max(highest, g);
    }
    next = *std::max_element(j.gpus.begin(), j.gpus.end()) + 1;
  }
  if (num_gpus == 0) num_gpus = highest + 1;
  if (highest >= num_gpus)
    return make_error("the jobs use GPUs up to {}, but the cluster has {} (--gpus)", highest, num_gpus);

  SharedFabricResult out;
  out.num_gpus = num_gpus;
  // Alone, one iteration each: how long each job is.
  std::vector<double> single;
  for (const JobSpec& j : jobs) {
    MT_ASSIGN(Run alone, run_jobs({&j}, {1}, options, num_gpus));
    single.push_back(alone.per_iteration.front());
  }
  const double longest = *std::max_element(single.begin(), single.end());
  std::vector<int> iterations;
  std::vector<const JobSpec*> all;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    iterations.push_back(std::clamp(static_cast<int>(std::lround(longest / single[i])), 1, max_iterations));
    all.push_back(&jobs[i]);
  }
  MT_ASSIGN(Run shared, run_jobs(all, iterations, options, num_gpus));
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    SharedJobResult r;
    r.name = jobs[i].name;
    r.gpus = static_cast<int>(jobs[i].gpus.size());
    r.first_gpu = *std::min_element(jobs[i].gpus.begin(), jobs[i].gpus.end());
    r.last_gpu = *std::max_element(jobs[i].gpus.begin(), jobs[i].gpus.end());
    r.iterations = iterations[i];
    r.alone_s = single[i];
    if (iterations[i] > 1) {
      MT_ASSIGN(Run alone, run_jobs({&jobs[i]}, {iterations[i]}, options, num_gpus));
      r.alone_s = alone.per_iteration.front();
    }
    r.shared_s = shared.per_iteration[i];
    out.jobs.push_back(r);
  }
  out.simulator_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return out;
}

}  // namespace meshtrain
