#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "engine/checkpoint.h"
#include "engine/training_data.h"
#include "engine/lr_schedule.h"
#include "engine/mesh.h"
#include "engine/metrics.h"
#include "engine/step_timing.h"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Status save_checkpoint(StepEngine& engine, bool writer, const ModelSpec& m, const Plan& p, const TrainOptions& o,
                       std::int64_t step, const LoaderState& loader) {
  MT_ASSIGN(auto state, engine.export_state());
  if (!writer) return {};
  CheckpointWriter w;
  w.set_model_and_plan(m, p);
  w.set_step(step);
  w.set_data_loader(loader);
  // Every random draw is counter-based on (seed, step): the seed is the whole RNG state.
  w.set_rng({{"seed", o.seed}});
  for (auto& [name, data] : state) {
    const std::int64_t n = static_cast<std::int64_t>(data.size());
    MT_TRY(w.add_tensor(name, {n}, std::move(data)));
  }
  return w.commit(o.checkpoint_dir);
}

}  // namespace

Status check_train_options(const TrainOptions& o, const ModelSpec& m, const Plan& p) {
  if (o.steps <= 0) return make_error("--steps must be positive, got {}", o.steps);
  if (o.stop_at < 0 || o.stop_at > o.steps)
    return make_error("--stop-at {} must be within 1..--steps {}", o.stop_at, o.steps);
  if (!(o.lr > 0) || o.min_lr < 0 || o.min_lr > o.lr)
    return make_error("need --lr > 0 and 0 <= --min-lr <= --lr, got lr {} min-lr {}", o.lr, o.min_lr);
  MT_TRY(validate_lr_schedule(LrSchedule{o.lr, o.min_lr, o.warmup, o.steps}));
  if (o.resume && o.checkpoint_dir.empty()) return make_error("--resume needs --checkpoint DIR");
  MT_TRY(StepEngine::supports(p));
  MT_TRY(check_training_data(o.data, m, p));
  if (!o.checkpoint_dir.empty()) MT_TRY(probe_checkpoint_dir(o.checkpoint_dir));
  if (!o.metrics.empty()) MT_TRY(MetricsWriter::open(o.metrics));
  return {};
}

Status train_rank(Backend& b, const ModelSpec& m, const Plan& p, const TrainOptions& o) {
  const bool leader = b.rank() == 0;
  const Mesh mesh(p);
  const Coord coord = mesh.coord_of(b.rank());
  const int seq = p.effective_seq_len(m);
  MT_ASSIGN(std::unique_ptr<TrainingData> data, open_training_data(o.data, m, p, o.seed, coord.dp, p.dp));
  StepTimer timer(b);
  FaultInjector faults(o.faults, b.rank(), o.ranks_are_processes, 3 * o.comm_timeout + std::chrono::seconds(1));
  if (!faults.empty()) timer.on_communication([&faults](double compute_s) { faults.before_communication(compute_s); });
  StepEngine engine(timer, m, p, mesh, o.step);
  // Every rank's step timing is gathered over a group of the whole world,
  // with an id after the mesh's; stages tell the report which ranks compare.
  Group world{0, {}};
  std::vector<int> stage;
  for (int k = 0; k < kGroupKinds; ++k)
    for (const Group& g : mesh.groups(static_cast<GroupKind>(k))) world.id = std::max(world.id, g.id + 1);
  for (int r = 0; r < p.world_size(); ++r) {
    world.ranks.push_back(r);
    stage.push_back(mesh.coord_of(r).pp);
  }
  const LrSchedule schedule{o.lr, o.min_lr, o.warmup, o.steps};

  std::int64_t first_step = 1;
  if (o.resume && has_checkpoint(o.checkpoint_dir)) {
    MT_ASSIGN(Checkpoint ckpt, load_checkpoint(o.checkpoint_dir));
    MT_TRY(check_compatible(ckpt, m, p));
    if (!ckpt.meta.rng.contains("seed") || ckpt.meta.rng["seed"].get<std::uint64_t>() != o.seed)
      return make_error("checkpoint '{}' was written with --seed {}, this run has --seed {}; resume with the "
                        "same seed", o.checkpoint_dir, ckpt.meta.rng.value("seed", 0ULL), o.seed);
    std::map<std::string, std::vector<float>> state;
    for (auto& [name, t] : ckpt.tensors) state.emplace(name, std::move(t.data));
    MT_TRY(engine.import_state(state));
    data->restore(ckpt.meta.data_loader);
    first_step = ckpt.meta.step + 1;
    if (leader && o.progress) fmt::print("resumed from {} at step {}\n", o.checkpoint_dir, ckpt.meta.step);
  }
  std::optional<MetricsWriter> metrics;
  if (leader && !o.metrics.empty()) {
    MT_ASSIGN(auto w, MetricsWriter::open(o.metrics));
    metrics.emplace(std::move(w));
  }
  std::vector<HostBatch> val;
  if (o.eval_every > 0) {
    MT_ASSIGN(val, data->held_out(p.micro_batch, m.vision() ? o.eval_images : o.eval_sequences));
  }

  const std::int64_t last_step = o.stop_at > 0 ? o.stop_at : o.steps;
  // Tokens (or images) per step, for throughput.
  const double tokens_per_step = static_cast<double>(p.effective_global_batch()) * (m.vision() ? 1 : seq);
  const auto start = Clock::now();
  for (std::int64_t step = first_step; step <= last_step; ++step) {
    const auto t0 = Clock::now();
    MT_ASSIGN(std::vector<HostBatch> batches, data->next(p.micro_batch, p.microbatches()));
    const double lr = lr_at(schedule, static_cast<int>(step));
    faults.begin_step(step);
    timer.begin_step();
    std::optional<Result<StepResult>> result;
    try {
      result.emplace(engine.step(batches, static_cast<float>(lr), step));
    } catch (const InjectedExit&) {
      return ok_status();  // a rank thread that "died": its peers find out on their own
    }
    if (!result->ok()) return std::move(*result).error();
    MT_ASSIGN(const RankTiming timing, timer.end_step());
    StepMetrics sm{step, (*result)->loss, lr, seconds_since(t0), 0, std::nullopt};
    sm.tokens_per_s = tokens_per_step / sm.step_time_s;
    if (p.world_size() > 1) {
      MT_ASSIGN(std::vector<RankTiming> all, gather_timings(b, timing, world).context(fmt::format("step {}", step)));
      const StragglerReport report = straggler_report(std::move(all), stage);
      RankTimes& rt = sm.ranks.emplace();
      rt.slowest_rank = report.slowest_rank;
      rt.slowest_compute_s = report.slowest_compute_s;
      rt.median_compute_s = report.median_compute_s;
      rt.lag_s = report.lag_s;
      for (const RankTiming& t : report.ranks) {
        rt.compute_s.push_back(t.compute_s);
        rt.comm_s.push_back(t.comm_s);
      }
    }
    if (o.eval_every > 0 && (step % o.eval_every == 0 || step == last_step)) {
      MT_ASSIGN(Evaluation v, engine.evaluate_metrics(val));
      sm.val_loss = v.loss;
      if (m.vision()) sm.val_accuracy = v.accuracy;
    }
    const bool save = !o.checkpoint_dir.empty() &&
                      ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == last_step);
    if (save) MT_TRY(save_checkpoint(engine, leader, m, p, o, step, data->state()));
    if (!leader) continue;
    if (metrics) MT_TRY(metrics->write(sm));
    if (o.progress) {
      std::string line = format_progress(step, o.steps, sm.loss, sm.tokens_per_s, seconds_since(start), data->unit());
      if (sm.val_loss) line += fmt::format(" | val {:.4f}", *sm.val_loss);
      if (sm.val_accuracy) line += fmt::format(" | val acc {:.2f}%", 100 * *sm.val_accuracy);
      if (sm.ranks) line += format_straggler(*sm.ranks);
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
  }
  return b.synchronize();
}

}  // namespace meshtrain
