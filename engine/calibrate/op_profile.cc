#include "engine/calibrate/op_profile.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/calibrate/workload.h"
#include "engine/cli/backend_registry.h"
#include "engine/cli/plan_flags.h"
#include "engine/plan/mesh.h"
#include "engine/simulation/simulation.h"
#include "engine/step/step_engine.h"
#include "simulator/calibration.h"

namespace meshtrain::calibrate {

using Clock = std::chrono::steady_clock;

void OpTimer::sync() {
  if (Status s = target().synchronize(); !s && status_) status_ = std::move(s);
}

template <class F>
void OpTimer::timed(const char* name, F&& f) {
  if (synchronize_) sync();
  const auto t0 = Clock::now();
  f();
  if (synchronize_) sync();
  OpTotals& t = totals_[name];
  t.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  ++t.calls;
}

// clang-format off
void OpTimer::fill(Tensor& x, float v) { timed("fill", [&] { target().fill(x, v); }); }
void OpTimer::copy(const Tensor& s, Tensor& d) { timed("copy", [&] { target().copy(s, d); }); }
void OpTimer::cast(const Tensor& s, Tensor& d) { timed("cast", [&] { target().cast(s, d); }); }
void OpTimer::add(const Tensor& a, const Tensor& b, Tensor& o) { timed("add", [&] { target().add(a, b, o); }); }
void OpTimer::scale(Tensor& x, float a) { timed("scale", [&] { target().scale(x, a); }); }
void OpTimer::axpy(float a, const Tensor& x, Tensor& y) { timed("axpy", [&] { target().axpy(a, x, y); }); }
void OpTimer::sum(const Tensor& x, Tensor& o, float s, bool acc) { timed("sum", [&] { target().sum(x, o, s, acc); }); }
void OpTimer::sum_squares(const Tensor& x, Tensor& o, bool acc) { timed("sum_squares", [&] { target().sum_squares(x, o, acc); }); }
void OpTimer::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) { timed("gemm", [&] { target().gemm(a, b, c, op); }); }
void OpTimer::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) { timed("batched_gemm", [&] { target().batched_gemm(a, b, c, op); }); }
void OpTimer::bias_backward(const Tensor& dy, Tensor& db) { timed("bias_backward", [&] { target().bias_backward(dy, db); }); }
void OpTimer::embedding_forward(const Tensor& t, const Tensor& ids, Tensor& o, std::int64_t off) { timed("embedding_forward", [&] { target().embedding_forward(t, ids, o, off); }); }
void OpTimer::embedding_backward(const Tensor& d, const Tensor& ids, Tensor& dt, std::int64_t off) { timed("embedding_backward", [&] { target().embedding_backward(d, ids, dt, off); }); }
void OpTimer::layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& o, Tensor& m, Tensor& r, float eps) { timed("layernorm_forward", [&] { target().layernorm_forward(x, w, b, o, m, r, eps); }); }
void OpTimer::layernorm_backward(const Tensor& d, const Tensor& x, const Tensor& w, const Tensor& m, const Tensor& r, Tensor& dx, Tensor& dw, Tensor& db) { timed("layernorm_backward", [&] { target().layernorm_backward(d, x, w, m, r, dx, dw, db); }); }
void OpTimer::gelu_forward(const Tensor& x, Tensor& o) { timed("gelu_forward", [&] { target().gelu_forward(x, o); }); }
void OpTimer::gelu_backward(const Tensor& d, const Tensor& x, Tensor& dx) { timed("gelu_backward", [&] { target().gelu_backward(d, x, dx); }); }
void OpTimer::dropout_forward(const Tensor& x, Tensor& o, const DropoutOp& op) { timed("dropout_forward", [&] { target().dropout_forward(x, o, op); }); }
void OpTimer::dropout_backward(const Tensor& d, Tensor& dx, const DropoutOp& op) { timed("dropout_backward", [&] { target().dropout_backward(d, dx, op); }); }
void OpTimer::gather_rows(const Tensor& s, const Tensor& i, Tensor& o) { timed("gather_rows", [&] { target().gather_rows(s, i, o); }); }
void OpTimer::moe_route(const Tensor& l, bool r, Tensor& p, Tensor& lse, Tensor& w, Tensor& e) { timed("moe_route", [&] { target().moe_route(l, r, p, lse, w, e); }); }
void OpTimer::moe_route_backward(const Tensor& dw, const Tensor& p, const Tensor& lse, const Tensor& e, const Tensor& g, float z, bool r, Tensor& dl) { timed("moe_route_backward", [&] { target().moe_route_backward(dw, p, lse, e, g, z, r, dl); }); }
void OpTimer::moe_combine(const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& o) { timed("moe_combine", [&] { target().moe_combine(rows, i, w, o); }); }
void OpTimer::moe_combine_backward(const Tensor& d, const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& dr, Tensor& dw) { timed("moe_combine_backward", [&] { target().moe_combine_backward(d, rows, i, w, dr, dw); }); }
void OpTimer::attention_forward(const Tensor& qkv, Tensor& o, Tensor& lse, const AttentionOp& op) { timed("attention_forward", [&] { target().attention_forward(qkv, o, lse, op); }); }
void OpTimer::attention_backward(const Tensor& d, const Tensor& qkv, const Tensor& o, const Tensor& lse, Tensor& dqkv, const AttentionOp& op) { timed("attention_backward", [&] { target().attention_backward(d, qkv, o, lse, dqkv, op); }); }
void OpTimer::cross_entropy_max(const Tensor& l, Tensor& m) { timed("cross_entropy_max", [&] { target().cross_entropy_max(l, m); }); }
void OpTimer::cross_entropy_partials(const Tensor& l, const Tensor& t, const Tensor& m, std::int64_t off, Tensor& s, Tensor& tl) { timed("cross_entropy_partials", [&] { target().cross_entropy_partials(l, t, m, off, s, tl); }); }
void OpTimer::cross_entropy_loss(const Tensor& m, const Tensor& s, const Tensor& tl, Tensor& l) { timed("cross_entropy_loss", [&] { target().cross_entropy_loss(m, s, tl, l); }); }
void OpTimer::cross_entropy_backward(const Tensor& l, const Tensor& t, const Tensor& m, const Tensor& s, std::int64_t off, float d, Tensor& dl) { timed("cross_entropy_backward", [&] { target().cross_entropy_backward(l, t, m, s, off, d, dl); }); }
void OpTimer::cross_entropy_accuracy(const Tensor& m, const Tensor& tl, Tensor& c, bool acc) { timed("cross_entropy_accuracy", [&] { target().cross_entropy_accuracy(m, tl, c, acc); }); }
void OpTimer::clip_coefficient(const Tensor& s, float n, Tensor& c) { timed("clip_coefficient", [&] { target().clip_coefficient(s, n, c); }); }
void OpTimer::adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const Tensor& c, const AdamWOp& op) { timed("adamw", [&] { target().adamw(p, g, m, v, c, op); }); }
// The multi-tensor ops under the names the simulator gives them.
void OpTimer::foreach_sum_squares(std::span<const Tensor> xs, Tensor& o) { timed("sum_squares", [&] { target().foreach_sum_squares(xs, o); }); }
void OpTimer::foreach_adamw(std::span<const AdamWTensors> ps, const Tensor& c, const AdamWOp& op) { timed("adamw", [&] { target().foreach_adamw(ps, c, op); }); }
void OpTimer::sign_compress(const Tensor& x, Tensor& e, Tensor& p) { timed("sign_compress", [&] { target().sign_compress(x, e, p); }); }
void OpTimer::sign_decompress(const Tensor& p, Tensor& o) { timed("sign_decompress", [&] { target().sign_decompress(p, o); }); }
void OpTimer::write(Tensor& dst, std::span<const float> host) { timed("write", [&] { target().write(dst, host); }); }
void OpTimer::write(Tensor& dst, std::span<const std::int32_t> host) { timed("write", [&] { target().write(dst, host); }); }
// clang-format on

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
  PlanFlags flags;
  flags.model = o.workload.substr(0, o.workload.find(':'));
  flags.overrides.micro_batch = static_cast<int>(w.batch);
  flags.overrides.seq_len = static_cast<int>(w.seq);
  flags.overrides.global_batch = flags.overrides.micro_batch;
  flags.overrides.precision = sim::dtype_name(cal.precision);
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(flags, 1));
  const int seq = mp.plan.effective_seq_len(mp.model);
  const std::vector<HostBatch> microbatches(1, example_batch(mp.model, mp.plan.micro_batch, seq));

  // `ranks` independent single-rank engines run at once, each on its share of
  // the cores (the compute of dp replicas without their gradient sync); rank 0 reports.
  std::vector<std::map<std::string, OpTotals>> totals(static_cast<std::size_t>(o.ranks));
  std::vector<double> step_s(static_cast<std::size_t>(o.ranks));
  std::vector<int> timed_steps(static_cast<std::size_t>(o.ranks));
  std::vector<Status> status(static_cast<std::size_t>(o.ranks));
  auto run = [&](Backend& backend, int rank) {
    const auto i = static_cast<std::size_t>(rank);
    OpTimer timer(backend, cuda);
    const Mesh mesh(mp.plan);
    StepEngine engine(timer, mp.model, mp.plan, mesh, StepOptions{});
    auto step = [&](int s) -> Status {
      auto r = engine.step(microbatches, 1e-4f, s);
      if (!r) return std::move(r).error();
      return timer.status();
    };
    if (status[i] = step(1); !status[i]) return;  // warm-up: first allocations, library heuristics
    timer.reset();
    const auto t0 = Clock::now();
    int s = 0;
    while (s < o.steps && (s == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < o.budget_s)) {
      if (status[i] = step(2 + s); !status[i]) return;
      ++s;
    }
    step_s[i] = std::chrono::duration<double>(Clock::now() - t0).count() / s;
    timed_steps[i] = s;
    totals[i] = timer.totals();
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
  const double real_step = step_s[0];
  const int steps = timed_steps[0];

  cal = cal.for_ranks_sharing(o.ranks);
  SimulateOptions options;
  options.cluster = cluster;
  sim::apply_link_calibration(cal, options.cluster);
  options.calibration = &cal;
  options.trace = true;
  MT_ASSIGN(SimulationResult r, simulate_iteration(mp.model, mp.plan, options));
  std::map<std::string, double> simulated;
  const nlohmann::json trace = nlohmann::json::parse(r.trace_json);
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("pid", -1) == 0)
      simulated[e.value("name", "")] += e.value("dur", 0.0) * 1e-6;

  struct Row {
    std::string op;
    long calls;
    double real, sim;
  };
  std::vector<Row> rows;
  double real_ops = 0;
  for (const auto& [op, t] : totals[0]) {
    rows.push_back({op, t.calls / steps, t.seconds / steps, simulated.count(op) ? simulated[op] : 0});
    real_ops += t.seconds / steps;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.real > y.real; });
  fmt::print("{:<24} {:>7} {:>10} {:>10} {:>7}\n", "op", "calls", "real ms", "sim ms", "sim/real");
  for (const Row& row : rows)
    fmt::print("{:<24} {:>7} {:>10.3f} {:>10.3f} {:>7.2f}\n", row.op, row.calls, row.real * 1e3,
               row.sim * 1e3, row.real > 0 ? row.sim / row.real : 0);
  fmt::print("ops total {:.3f} ms; real step {:.3f} ms (host outside ops {:.3f} ms); "
             "simulated iteration {:.3f} ms; {} {} step(s) timed on the {} backend\n",
             real_ops * 1e3, real_step * 1e3, (real_step - real_ops) * 1e3, r.iteration_s * 1e3, steps,
             sim::dtype_name(cal.precision), cuda ? "cuda" : "cpu");
  return ok_status();
}

}  // namespace meshtrain::calibrate
