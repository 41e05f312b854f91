#include "engine/calibrate/op_profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/calibrate/workload.h"
#include "engine/cli/backend_registry.h"
#include "engine/cli/plan_flags.h"
#include "engine/simulation/simulation.h"
#include "engine/step/training_engine.h"
#include "simulator/calibration.h"

namespace meshtrain::calibrate {

using Clock = std::chrono::steady_clock;

void OpTimer::sync() {
  if (Status s = target().synchronize(); !s && status_) status_ = std::move(s);
}

template <class F>
void OpTimer::timed(std::string_view name, F&& f) {
  if (synchronize_) sync();
  const auto t0 = Clock::now();
  f();
  if (synchronize_) sync();
  OpTotals& t = totals_[std::string(name)];
  t.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  ++t.calls;
}

void OpTimer::on_op(const OpInfo& op, const OpArgs&, const Call& call) { timed(op.cost_name, call); }
void OpTimer::write(Tensor& dst, std::span<const float> host) { timed("write", [&] { target().write(dst, host); }); }
void OpTimer::write(Tensor& dst, std::span<const std::int32_t> host) {
  timed("write", [&] { target().write(dst, host); });
}

namespace {

// The cluster preset whose device the calibration was measured on (local-cpu for the cpu backend).
Result<sim::ClusterSpec> cluster_of(const sim::Calibration& cal, const std::string& path) {
  for (const std::string& name : sim::cluster_preset_names()) {
    MT_ASSIGN(sim::ClusterSpec spec, sim::cluster_preset(name));
    if (sim::check_calibration_device(cal, spec).ok()) return spec;
  }
  return make_error("--calibration '{}' was measured on '{}', which no cluster preset ({}) has; --profile "
                    "compares with a simulation of that device",
                    path, cal.device, fmt::join(sim::cluster_preset_names(), ", "));
}

}  // namespace

namespace {

// The workload's model and single-rank plan, at the calibration's precision.
Result<ModelAndPlan> profile_plan(const Workload& w, const std::string& workload, const sim::Calibration& cal) {
  PlanFlags flags;
  flags.model = workload.substr(0, workload.find(':'));
  flags.overrides.micro_batch = static_cast<int>(w.batch);
  flags.overrides.seq_len = static_cast<int>(w.seq);
  flags.overrides.global_batch = flags.overrides.micro_batch;
  flags.overrides.precision = sim::dtype_name(cal.precision);
  return resolve_model_and_plan(flags, 1);
}

// What rank 0 measured: its ops' totals over the timed steps, and a step's wall time.
struct RealProfile {
  std::map<std::string, OpTotals> totals;
  double step_s = 0;
  int steps = 0;
};

// `o.ranks` independent single-rank engines run at once, each on its share
// of the cores (the compute of dp replicas without their gradient sync);
// rank 0 reports. One warm-up step (first allocations, library heuristics),
// then up to o.steps timed ones within o.budget_s (at least one).
Result<RealProfile> time_real_steps(const ProfileOptions& o, const ModelAndPlan& mp, bool cuda) {
  const int seq = mp.plan.effective_seq_len(mp.model);
  const std::vector<HostBatch> microbatches(1, example_batch(mp.model, mp.plan.micro_batch, seq));
  std::vector<RealProfile> profiles(static_cast<std::size_t>(o.ranks));
  std::vector<Status> status(static_cast<std::size_t>(o.ranks));
  auto run = [&](Backend& backend, int rank) {
    const auto i = static_cast<std::size_t>(rank);
    OpTimer timer(backend, cuda);
    TrainingEngine engine(timer, mp.model, mp.plan, StepOptions{});
    auto step = [&](int s) -> Status {
      auto r = engine.step(microbatches, 1e-4f, s);
      if (!r) return std::move(r).error();
      return timer.status();
    };
    if (status[i] = step(1); !status[i]) return;
    timer.reset();
    const auto t0 = Clock::now();
    int s = 0;
    while (s < o.steps && (s == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < o.budget_s)) {
      if (status[i] = step(2 + s); !status[i]) return;
      ++s;
    }
    profiles[i] = {timer.totals(), std::chrono::duration<double>(Clock::now() - t0).count() / s, s};
  };
  if (cuda) {
    MT_ASSIGN(std::unique_ptr<Backend> backend, make_backend({.name = "cuda"}));
    run(*backend, 0);
  } else {
    auto body = [&](int rank) {
      auto backend = make_backend({.name = "cpu", .threads = o.rank_threads, .ranks_sharing = o.ranks});
      if (!backend) return void(status[static_cast<std::size_t>(rank)] = std::move(backend).error());
      run(**backend, rank);
    };
    std::vector<std::thread> threads;
    for (int r = 1; r < o.ranks; ++r) threads.emplace_back(body, r);
    body(0);
    for (auto& t : threads) t.join();
  }
  for (auto& st : status) MT_TRY(st);
  return std::move(profiles.front());
}

// The simulated iteration of the same plan with the calibration (shared by
// `ranks` ranks), and its seconds per op name on rank 0.
struct SimulatedProfile {
  std::map<std::string, double> op_s;
  double iteration_s = 0;
};

Result<SimulatedProfile> simulate_profile(const ModelAndPlan& mp, const sim::Calibration& cal,
                                          const sim::ClusterSpec& cluster) {
  SimulateOptions options;
  options.cluster = cluster;
  sim::apply_link_calibration(cal, options.cluster);
  options.calibration = &cal;
  options.trace = true;
  MT_ASSIGN(SimulationResult r, simulate_iteration(mp.model, mp.plan, options));
  SimulatedProfile out{{}, r.iteration_s};
  const nlohmann::json trace = nlohmann::json::parse(r.trace_json);
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("pid", -1) == 0) out.op_s[e.value("name", "")] += e.value("dur", 0.0) * 1e-6;
  return out;
}

void print_profile(const RealProfile& real, const SimulatedProfile& simulated, const sim::Calibration& cal,
                   bool cuda) {
  struct Row {
    std::string op;
    long calls;
    double real, sim;
  };
  std::vector<Row> rows;
  double real_ops = 0;
  const int steps = real.steps;
  for (const auto& [op, t] : real.totals) {
    const auto it = simulated.op_s.find(op);
    rows.push_back({op, t.calls / steps, t.seconds / steps, it != simulated.op_s.end() ? it->second : 0});
    real_ops += t.seconds / steps;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.real > y.real; });
  fmt::print("{:<24} {:>7} {:>10} {:>10} {:>7}\n", "op", "calls", "real ms", "sim ms", "sim/real");
  for (const Row& row : rows)
    fmt::print("{:<24} {:>7} {:>10.3f} {:>10.3f} {:>7.2f}\n", row.op, row.calls, row.real * 1e3,
               row.sim * 1e3, row.real > 0 ? row.sim / row.real : 0);
  fmt::print("ops total {:.3f} ms; real step {:.3f} ms (host outside ops {:.3f} ms); "
             "simulated iteration {:.3f} ms; {} {} step(s) timed on the {} backend\n",
             real_ops * 1e3, real.step_s * 1e3, (real.step_s - real_ops) * 1e3, simulated.iteration_s * 1e3, steps,
             sim::dtype_name(cal.precision), cuda ? "cuda" : "cpu");
}

}  // namespace

Status print_op_profile(const ProfileOptions& o) {
  if (o.steps < 1) return make_error("--profile-steps {} must be >= 1", o.steps);
  if (o.ranks < 1 || o.ranks > 64) return make_error("--profile-ranks {} must be in [1, 64]", o.ranks);
  MT_ASSIGN(const Workload w, parse_workload(o.workload, "--profile"));
  // The calibration first: it decides the backend and precision of the real step, and a wrong
  // one should not cost a profile's run.
  MT_ASSIGN(sim::Calibration cal, sim::load_calibration(o.calibration));
  const bool cuda = cal.machine.backend == "cuda";
  if (!cuda && cal.precision != sim::DType::kFp32)
    return make_error("--calibration '{}' is {} but the cpu backend runs fp32 only; profile it on the GPU it "
                      "was measured on (a cuda calibration) or with an fp32 calibration",
                      o.calibration, sim::dtype_name(cal.precision));
  if (cuda && o.ranks != 1)
    return make_error("--profile-ranks {}: a cuda profile runs one rank on one GPU; use --profile-ranks 1", o.ranks);
  MT_ASSIGN(sim::ClusterSpec cluster, cluster_of(cal, o.calibration));
  MT_ASSIGN(ModelAndPlan mp, profile_plan(w, o.workload, cal));
  MT_ASSIGN(const RealProfile real, time_real_steps(o, mp, cuda));
  cal = cal.for_ranks_sharing(o.ranks);
  MT_ASSIGN(const SimulatedProfile simulated, simulate_profile(mp, cal, cluster));
  print_profile(real, simulated, cal, cuda);
  return ok_status();
}

}  // namespace meshtrain::calibrate
