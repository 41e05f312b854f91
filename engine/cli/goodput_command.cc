// `meshtrain goodput`: the simulated iteration time, the checkpoint write
// time and a per-GPU failure rate combined into the expected goodput of a
// run and the checkpoint interval that maximises it (engine/simulation/goodput.h).
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/memory/memory_model.h"
#include "engine/simulation/goodput.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

struct GoodputFlags {
  PlanFlags plan;
  std::string cluster = "dgx-a100";
  int gpus = 0;  // 0: the plan's world
  double mtbf_hours = 0;       // per GPU
  std::int64_t checkpoint_every = 0;  // steps; 0: report the optimum only
  double restart_minutes = 10;
  double storage_gbps = 50;    // GB/s the checkpoint is written at, all ranks together
  double iteration_s = 0;      // > 0: use it instead of simulating
  bool json = false;
};

std::string hours(double s) {
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  return s >= 60 ? fmt::format("{:.1f} min", s / 60) : fmt::format("{:.3g} s", s);
}

nlohmann::json plan_json(const GoodputInputs& in, const GoodputPlan& p) {
  const WallShares w = wall_shares(in, p.interval_s);
  return {{"checkpoint_every_steps", p.steps},
          {"interval_s", p.interval_s},
          {"goodput", p.goodput},
          {"makes_progress", p.goodput >= kNoProgressGoodput},
          {"share_checkpoints", w.checkpoints},
          {"share_failures", w.failures}};
}

// What the report is made of: the run's inputs, the optimum and the given interval, per step's tokens.
struct GoodputReport {
  const GoodputFlags& f;
  ModelAndPlan mp;
  sim::ClusterSpec cluster;
  int gpus = 0;
  double bytes = 0, tokens_per_step = 0;
  GoodputInputs in{};
  GoodputPlan best{};
  std::optional<GoodputPlan> given{};
};

Result<GoodputReport> goodput_report(GoodputFlags& f) {
  MT_TRY(dp_from_gpus(f.plan, f.gpus));
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, f.gpus));
  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  double iteration = f.iteration_s;
  if (iteration <= 0) {
    options.check_memory = false;  // goodput is about time; `simulate` reports memory
    MT_ASSIGN(SimulationResult r, simulate_iteration(mp.model, mp.plan, options));
    iteration = r.iteration_s;
  }
  GoodputReport g{f, std::move(mp), options.cluster};
  g.gpus = g.mp.plan.world_size();
  g.bytes = checkpoint_bytes(static_cast<double>(count_parameters(g.mp.model).total));
  g.in.iteration_s = iteration;
  g.in.checkpoint_s = g.bytes / (f.storage_gbps * 1e9);
  g.in.restart_s = f.restart_minutes * 60;
  g.in.job_mtbf_s = f.mtbf_hours * 3600 / g.gpus;
  MT_TRY(check_goodput_inputs(g.in));
  g.best = optimal_steps(g.in);
  if (f.checkpoint_every > 0) g.given = at_steps(g.in, f.checkpoint_every);
  g.tokens_per_step = static_cast<double>(g.mp.plan.effective_global_batch()) * g.mp.plan.effective_seq_len(g.mp.model);
  return g;
}

void print_goodput_json(const GoodputReport& g) {
  const GoodputInputs& in = g.in;
  nlohmann::json out = {{"model", g.mp.model.name},
                        {"cluster", g.cluster.name},
                        {"gpus", g.gpus},
                        {"iteration_time_s", in.iteration_s},
                        {"checkpoint_bytes", g.bytes},
                        {"checkpoint_write_s", in.checkpoint_s},
                        {"restart_s", in.restart_s},
                        {"gpu_mtbf_hours", g.f.mtbf_hours},
                        {"job_mtbf_s", in.job_mtbf_s},
                        {"optimal", plan_json(in, g.best)},
                        {"young_interval_s", young_interval_s(in)},
                        {"daly_interval_s", daly_interval_s(in)}};
  out["optimal"]["continuous_interval_s"] = optimal_interval_s(in);
  if (g.given) {
    out["given"] = plan_json(in, *g.given);
    out["given"]["effective_tokens_per_s"] = g.tokens_per_step / in.iteration_s * g.given->goodput;
  }
  fmt::print("{}\n", out.dump(2));
}

// One checkpoint interval's line: its goodput and where the rest of the wall time goes.
void print_interval(const GoodputReport& g, const char* label, const GoodputPlan& p) {
  const GoodputInputs& in = g.in;
  // The exact shares of the wall time (engine/simulation/goodput.h): they and the goodput sum to 100%.
  const WallShares w = wall_shares(in, p.interval_s);
  if (p.goodput < kNoProgressGoodput) {
    fmt::print("{:<16} every {} steps ({} of training): no progress (goodput {:.2g}); failures take {:.2f}% of the "
               "wall time\n",
               label, p.steps, hours(p.interval_s), p.goodput, 100 * w.failures);
    return;
  }
  fmt::print("{:<16} every {} steps ({} of training): goodput {:.2f}% ({:.0f} tokens/s of {:.0f}); lost to "
             "checkpoints {:.2f}%, to failures {:.2f}%\n",
             label, p.steps, hours(p.interval_s), 100 * p.goodput, g.tokens_per_step / in.iteration_s * p.goodput,
             g.tokens_per_step / in.iteration_s, 100 * w.checkpoints, 100 * w.failures);
}

void print_goodput_text(const GoodputReport& g) {
  const GoodputFlags& f = g.f;
  const GoodputInputs& in = g.in;
  const Plan& p = g.mp.plan;
  fmt::print("goodput of {} on {} x {} ({}): tp {} pp {} dp {}\n", g.mp.model.name, g.gpus, g.cluster.device.name,
             g.cluster.name, p.tp, p.pp, p.dp);
  fmt::print("iteration        {:.4f} s ({})\n", in.iteration_s, f.iteration_s > 0 ? "given" : "simulated");
  fmt::print("checkpoint       {} (12 B per parameter: fp32 weights and AdamW moments) written in {:.1f} s at {} GB/s\n",
             human_bytes(g.bytes), in.checkpoint_s, f.storage_gbps);
  fmt::print("failures         each GPU {} h between failures: the job {} ({:.2f} failures a day); restart {}\n",
             f.mtbf_hours, hours(in.job_mtbf_s), 86400 / in.job_mtbf_s, hours(in.restart_s));
  if (g.given) print_interval(g, "as given", *g.given);
  print_interval(g, "optimum", g.best);
  fmt::print("first order      Young sqrt(2·C·MTBF) = {}, Daly {} (the optimum above: {})\n",
             hours(young_interval_s(in)), hours(daly_interval_s(in)), hours(optimal_interval_s(in)));
  if (g.best.goodput < kNoProgressGoodput) {
    fmt::print("no progress      the job fails every {} on average, but restarting takes {}, a step {} and a "
               "checkpoint {}: failures undo the work faster than any checkpoint interval can save it. Make "
               "failures rarer (a larger --mtbf-hours, fewer --gpus) or restarts and checkpoints faster "
               "(--restart-minutes, --storage-GBps)\n",
               hours(in.job_mtbf_s), hours(in.restart_s), hours(in.iteration_s), hours(in.checkpoint_s));
  } else if (g.given && g.given->goodput < kNoProgressGoodput) {
    fmt::print("no progress      at --checkpoint-every {} the job fails every {} on average, before most segments "
               "of {} reach their checkpoint: checkpoint more often, e.g. --checkpoint-every {} (goodput "
               "{:.2f}%)\n",
               g.given->steps, hours(in.job_mtbf_s), hours(g.given->interval_s), g.best.steps, 100 * g.best.goodput);
  }
}

Status run_goodput(GoodputFlags f) {
  MT_ASSIGN(const GoodputReport g, goodput_report(f));
  if (f.json) print_goodput_json(g);
  else print_goodput_text(g);
  return {};
}

}  // namespace

Command add_goodput_command(CLI::App& app) {
  auto f = std::make_shared<GoodputFlags>();
  CLI::App* sub = app.add_subcommand(
      "goodput", "expected goodput of a run under GPU failures, and the checkpoint interval that maximises it");
  add_plan_flags(*sub, f->plan, "gpt3-175b");
  add_cluster_flags(*sub, f->cluster, f->gpus, "GPUs (dp defaults to gpus / (tp·pp·cp))");
  // Bounds far beyond any real run (a century of MTBF, a year per step) that keep every product finite.
  const RealRange kPositive{0, 1e9, true};
  sub->add_option("--mtbf-hours", f->mtbf_hours, "mean time between failures of one GPU, hours")
      ->required()
      ->check(real_in(kPositive));
  sub->add_option("--checkpoint-every", f->checkpoint_every, "steps between checkpoints (0: report the optimum only)")
      ->capture_default_str()
      ->check(int_in({0, 1 << 30}));
  sub->add_option("--restart-minutes", f->restart_minutes,
                  "minutes from a failure to training again (rescheduling, start-up, loading the checkpoint)")
      ->capture_default_str()
      ->check(real_in({0, 1e9}));
  // At least 1 MB/s: 1e-300 GB/s made checkpoint times of 1e300 s and printed overflowed figures.
  sub->add_option("--storage-GBps", f->storage_gbps, "GB/s the whole job writes a checkpoint at")
      ->capture_default_str()
      ->check(real_in({1e-3, 1e9}));
  sub->add_option("--iteration-s", f->iteration_s, "seconds per step, instead of simulating the plan")
      ->check(real_in({0, 1e9}));
  sub->add_flag("--json", f->json, "print one JSON object");
  return {sub, [f] { return run_goodput(*f); }};
}

}  // namespace meshtrain
