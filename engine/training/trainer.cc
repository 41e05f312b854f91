#include "engine/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <new>
#include <optional>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "core/json_input.h"
#include "core/last_words.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/export/hf_export.h"
#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "engine/step/fp8_training.h"
#include "engine/step/training_engine.h"
#include "engine/training/lr_schedule.h"
#include "engine/training/metrics.h"
#include "engine/training/run_summary.h"
#include "engine/training/step_timing.h"
#include "engine/training/stop_request.h"
#include "engine/training/train_guard.h"
#include "engine/training/training_data.h"
#include "models/flops.h"
#include "models/model_io.h"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The name under which a checkpoint keeps rank r's own state (TrainingEngine::export_rank_state:
// its 1bit error feedback), beside the plan-independent tensors of export_state; only
// ranks that have such state get one.
std::string rank_state_name(int rank) { return fmt::format("grad_error/rank{}", rank); }

// Every rank's own state, gathered over `world` (index = rank): the sizes
// first (each as two floats of 20 bits, exact in fp32), then the states
// padded to the largest.
Result<std::vector<std::vector<float>>> gather_rank_states(Backend& b, const Group& world,
                                                           const std::vector<float>& mine) {
  const auto W = static_cast<std::size_t>(world.size());
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor size = b.empty(Shape{2}), sizes = b.empty(Shape{2 * world.size()});
  b.write(size, std::vector<float>{static_cast<float>(n >> 20), static_cast<float>(n & 0xFFFFF)});
  b.all_gather(size, sizes, world);
  std::vector<float> host(2 * W);
  MT_TRY(b.read(sizes, host));
  std::vector<std::int64_t> counts(W);
  for (std::size_t r = 0; r < W; ++r)
    counts[r] = (static_cast<std::int64_t>(host[2 * r]) << 20) + static_cast<std::int64_t>(host[2 * r + 1]);
  const std::int64_t largest = *std::max_element(counts.begin(), counts.end());
  std::vector<std::vector<float>> out(W);
  if (largest == 0) return out;
  std::vector<float> padded(mine);
  padded.resize(static_cast<std::size_t>(largest), 0.f);
  Tensor part = b.empty(Shape{largest}), all = b.empty(Shape{largest * world.size()});
  b.write(part, padded);
  b.all_gather(part, all, world);
  std::vector<float> every(static_cast<std::size_t>(largest) * W);
  MT_TRY(b.read(all, every));
  for (std::size_t r = 0; r < W; ++r) {
    const auto begin = every.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(largest));
    out[r].assign(begin, begin + counts[r]);
  }
  return out;
}

Status save_checkpoint(Backend& b, TrainingEngine& engine, bool writer, const ModelSpec& m, const Plan& p,
                       const TrainOptions& o, std::int64_t step, const LoaderState& loader, const nlohmann::json& run) {
  MT_ASSIGN(auto state, engine.export_state());
  MT_ASSIGN(const std::vector<float> own, engine.export_rank_state());
  MT_ASSIGN(auto per_rank, gather_rank_states(b, plan_world(p), own));
  if (!writer) return {};
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    if (!per_rank[r].empty()) state.emplace(rank_state_name(static_cast<int>(r)), std::move(per_rank[r]));
  CheckpointWriter w;
  w.set_model_and_plan(m, p);
  w.set_step(step);
  w.set_data_loader(loader);
  // Every random draw is counter-based on (seed, step): the seed is the whole RNG state.
  w.set_rng({{"seed", o.seed}});
  w.set_run(run);
  if (o.tokenizer) w.set_tokenizer(*o.tokenizer);
  for (auto& [name, data] : state) {
    const std::int64_t n = static_cast<std::int64_t>(data.size());
    MT_TRY(w.add_tensor(name, {n}, std::move(data)));
  }
  return w.commit(o.checkpoint_dir);
}

}  // namespace

int warmup_steps(const TrainOptions& o) { return o.warmup.value_or(std::min(kDefaultWarmup, o.steps)); }

LrSchedule lr_schedule(const TrainOptions& o) {
  return {o.lr, o.min_lr, warmup_steps(o), o.steps, o.lr_decay, o.decay_steps};
}

Status check_train_options(const TrainOptions& o, const ModelSpec& m, const Plan& p, int host_ranks) {
  if (o.steps <= 0) return make_error("--steps must be positive, got {}", o.steps);
  if (o.stop_at < 0 || o.stop_at > o.steps)
    return make_error("--stop-at {} must be within 1..--steps {}", o.stop_at, o.steps);
  if (!(o.lr > 0) || !std::isfinite(o.lr) || o.min_lr < 0 || o.min_lr > o.lr)
    return make_error("need finite --lr > 0 and 0 <= --min-lr <= --lr, got lr {} min-lr {}", o.lr, o.min_lr);
  MT_TRY(validate_lr_schedule(lr_schedule(o)));
  MT_TRY(check_step_options(o.step));
  MT_TRY(check_faults(o.faults, p.world_size(), o.stop_at > 0 ? o.stop_at : o.steps));
  if (o.checkpoint_dir.empty()) {
    // Flags that only mean something with a checkpoint do nothing without one: say so.
    if (o.resume) return make_error("--resume needs --checkpoint DIR");
    if (o.overwrite_checkpoint) return make_error("--overwrite-checkpoint needs --checkpoint DIR");
    if (o.stop_at > 0)
      return make_error("--stop-at {} stops the run as a preemption would, but without --checkpoint DIR nothing "
                        "is saved to continue from; add --checkpoint DIR", o.stop_at);
    if (o.checkpoint_every > 0) return make_error("--checkpoint-every {} needs --checkpoint DIR", o.checkpoint_every);
  }
  if (o.resume && o.overwrite_checkpoint)
    return make_error("--resume continues the checkpoint and --overwrite-checkpoint replaces it; give one of them");
  MT_TRY(StepEngine::supports(p, o.step));
  MT_TRY(check_training_data(o.data, m, p));
  MT_TRY(check_train_memory(o, m, p, host_ranks));
  if (!o.metrics.empty()) MT_TRY(MetricsWriter::open(o.metrics));
  return {};
}

Result<std::optional<CheckpointLock>> claim_checkpoint(const TrainOptions& o) {
  if (o.checkpoint_dir.empty()) return std::optional<CheckpointLock>();
  const CheckpointUse use = o.resume                 ? CheckpointUse::resume
                            : o.overwrite_checkpoint ? CheckpointUse::overwrite
                                                     : CheckpointUse::fresh;
  std::vector<std::string> run_files;
  if (!o.metrics.empty()) run_files.push_back(o.metrics);
  MT_ASSIGN(CheckpointLock lock, claim_checkpoint_dir(o.checkpoint_dir, use, run_files));
  return std::optional<CheckpointLock>(std::move(lock));
}

namespace {

// Where a run starts: from its checkpoint under --resume (after checking
// that the checkpoint fits this run), else from step 1, with --init-from's
// parameters when given.
struct ResumePoint {
  std::int64_t first_step = 1;
  std::int64_t last_saved = 0;  // the step of the checkpoint on disk; 0: none yet
};

Result<ResumePoint> resume_or_init(Backend& b, TrainingEngine& engine, TrainingData& data, const ModelSpec& m,
                                   const Plan& p, const TrainOptions& o, const nlohmann::json& run, bool leader) {
  if (o.resume && has_checkpoint(o.checkpoint_dir)) {
    MT_ASSIGN(Checkpoint ckpt, load_checkpoint(o.checkpoint_dir));
    MT_TRY(check_compatible(ckpt, m, p));
    const nlohmann::json& seed = ckpt.meta.rng.is_object() ? ckpt.meta.rng.value("seed", nlohmann::json()) : nlohmann::json();
    if (!seed.is_number_unsigned() || seed.get<std::uint64_t>() != o.seed)
      return make_error("checkpoint '{}' was written with --seed {}, this run has --seed {}; resume with the "
                        "same seed", o.checkpoint_dir, json_excerpt(seed), o.seed);
    MT_TRY(check_resume(ckpt.meta, o, run, leader));
    std::map<std::string, std::vector<float>> state;
    for (auto& [name, t] : ckpt.tensors) state.emplace(name, std::move(t.data));
    MT_TRY(engine.import_state(state));
    // A rank's own state is absent where it has none (or the checkpoint predates it: then the
    // import names the values it misses).
    const auto own = state.find(rank_state_name(b.rank()));
    MT_TRY(engine.import_rank_state(own == state.end() ? std::span<const float>() : std::span<const float>(own->second))
               .context(fmt::format("checkpoint '{}'", o.checkpoint_dir)));
    data.restore(ckpt.meta.data_loader);
    if (leader && o.progress) fmt::print("resumed from {} at step {}\n", o.checkpoint_dir, ckpt.meta.step);
    if (leader && ckpt.meta.step == o.steps)
      warn(fmt::format("the checkpoint in '{}' is at step {}, which is --steps: the run is complete and there is "
                       "nothing to do; raise --steps to train further", o.checkpoint_dir, o.steps));
    return ResumePoint{ckpt.meta.step + 1, ckpt.meta.step};
  }
  if (o.resume && leader) warn(fmt::format("--resume: no checkpoint in '{}' yet; starting from step 1", o.checkpoint_dir));
  if (o.init_parameters) {
    // As a resume loads a checkpoint's state, with the zero AdamW moments of a fresh run.
    MT_TRY(engine.import_state(initial_training_state(*o.init_parameters))
               .context(fmt::format("--init-from '{}'", o.init_from)));
    if (leader && o.progress) fmt::print("initialised from {}\n", o.init_from);
  }
  return ResumePoint{};
}

// One step's progress line: loss and throughput, then what the step measured besides.
std::string progress_line(const StepMetrics& sm, std::int64_t steps, double elapsed_s, const char* unit,
                          bool drops_tokens) {
  std::string line = format_progress(sm.step, steps, sm.loss, sm.tokens_per_s, elapsed_s, unit);
  if (sm.val_loss) line += fmt::format(" | val {:.4f}", *sm.val_loss);
  if (sm.val_accuracy) line += fmt::format(" | val acc {:.2f}%", 100 * *sm.val_accuracy);
  if (sm.moe) {
    line += fmt::format(" | aux {:.4f} | load max/mean {:.2f}", sm.moe->aux_loss, sm.moe->load_max_over_mean);
    if (drops_tokens) line += fmt::format(" | dropped {:.1f}%", 100 * sm.moe->dropped_fraction);
  }
  if (sm.ranks) line += format_straggler(*sm.ranks);
  return line;
}

// The per-rank timings a multi-rank step's metrics carry.
RankTimes rank_times(const StragglerReport& report) {
  RankTimes rt;
  rt.slowest_rank = report.slowest_rank;
  rt.slowest_compute_s = report.slowest_compute_s;
  rt.median_compute_s = report.median_compute_s;
  rt.lag_s = report.lag_s;
  for (const RankTiming& t : report.ranks) {
    rt.compute_s.push_back(t.compute_s);
    rt.comm_s.push_back(t.comm_s);
  }
  return rt;
}

// One rank's training run: what it opens once, then each step of the loop.
class RankRun {
 public:
  RankRun(Backend& b, const ModelSpec& m, const Plan& p, const TrainOptions& o);
  // The data, where the run starts (checkpoint, --init-from or step 1), the metrics file and the held-out batches.
  Status open();
  // Every step, then the summary.
  Status train();

 private:
  // The engine's step on the next batches; a failure, or this rank's injected death, says where the
  // last good checkpoint is.
  Result<StepResult> train_step(std::int64_t step, double lr);
  // The step's figures: throughput, every rank's timings, the MoE statistics, the held-out evaluation.
  Result<StepMetrics> measure(const StepResult& r, std::int64_t step, double lr, Clock::time_point t0);
  void add_to_summary(const StepMetrics& sm);
  // The checkpoint when due, the metrics line and the progress line; whether it saved.
  Result<bool> record(const StepMetrics& sm, double lr);
  // The ranks' vote after a step: an Error stops every rank there, with the step saved unless it just was.
  Status stop_if_requested(std::int64_t step, double lr, bool saved);
  Status save(std::int64_t step, double lr);
  // Errors after a step say where the last good checkpoint is.
  std::string checkpoint_note() const;
  bool checkpointing() const { return !o_.checkpoint_dir.empty(); }

  Backend& b_;
  const ModelSpec& m_;
  const Plan& p_;
  const TrainOptions& o_;
  const Clock::time_point run_start_ = Clock::now();
  const bool leader_;
  const int seq_;
  const ModelIo io_;
  StepTimer timer_;
  FaultInjector faults_;
  std::unique_ptr<TrainingEngine> engine_;
  // A uniform plan's rank reads its data-parallel replica's micro-batches; a
  // plan made of segments reads the whole global batch on every rank.
  DataShare share_;
  std::unique_ptr<TrainingData> data_;
  const LrSchedule schedule_;
  nlohmann::json run_;
  // The stop vote and the step timings are gathered over every rank; ranks
  // of one role (stage) tell the straggler report which ranks compare.
  const Group world_;
  std::optional<StopVote> stop_vote_;
  const std::vector<int> stage_;
  std::int64_t first_step_ = 1;
  std::int64_t last_saved_ = 0;  // the step of the checkpoint on disk; 0: none yet
  const std::int64_t last_step_;
  std::optional<MetricsWriter> metrics_;
  std::vector<HostBatch> val_;
  // Loss terms (tokens, or images) per step, for throughput.
  const double tokens_per_step_;
  Clock::time_point start_;
  RunSummary summary_;
};

RankRun::RankRun(Backend& b, const ModelSpec& m, const Plan& p, const TrainOptions& o)
    : b_(b), m_(m), p_(p), o_(o), leader_(b.rank() == 0), seq_(p.effective_seq_len(m)), io_(model_io(m, seq_)),
      timer_(b),
      faults_(o.faults, b.rank(), o.ranks_are_processes, 3 * o.comm_timeout + std::chrono::seconds(1),
              o.rank_losses.get()),
      schedule_(lr_schedule(o)), world_(plan_world(p)), stage_(pipeline_positions(p)),
      last_step_(o.stop_at > 0 ? o.stop_at : o.steps),
      tokens_per_step_(static_cast<double>(p.effective_global_batch()) * static_cast<double>(io_.throughput_tokens())) {
  if (!faults_.empty()) timer_.on_communication([this](double compute_s) { faults_.before_communication(compute_s); });
  // A crash on this rank's thread names it (rank threads; under MPI the process is the rank).
  last_words::set_thread_rank(b.rank());
  engine_ = make_engine(timer_, m, p, o.step);
  share_ = engine_->data_share();
}

Status RankRun::open() {
  MT_ASSIGN(data_, open_training_data(o_.data, m_, p_, o_.seed, share_.replica, share_.replicas));
  run_ = run_record(o_, data_->source(), data_->content());
  stop_vote_.emplace(b_, world_);
  MT_ASSIGN(const ResumePoint start_at, resume_or_init(b_, *engine_, *data_, m_, p_, o_, run_, leader_));
  first_step_ = start_at.first_step;
  last_saved_ = start_at.last_saved;
  last_words::set_saved_step(last_saved_);
  last_words::set_step(0, o_.steps);
  for (const Fault& f : o_.faults)
    if (f.step < first_step_)
      return make_error("--fault-inject {}: step {} is never reached, this run resumes at step {}; inject it at a "
                        "step in {}..{}", fault_spec(f), f.step, first_step_, first_step_, o_.steps);
  if (leader_ && !o_.metrics.empty()) {
    MT_ASSIGN(auto w, MetricsWriter::open(o_.metrics));
    metrics_.emplace(std::move(w));
  }
  if (o_.eval_every > 0) {
    // Held-out samples are counted as images where the model reads images, as sequences otherwise.
    MT_ASSIGN(val_, data_->held_out(p_.micro_batch, io_.pixels_per_sample() > 0 ? o_.eval_images : o_.eval_sequences));
  }
  return ok_status();
}

std::string RankRun::checkpoint_note() const {
  if (!checkpointing()) return std::string("no --checkpoint was given, so nothing was saved");
  if (last_saved_ == 0) return fmt::format("no checkpoint was written to '{}' yet", o_.checkpoint_dir);
  return fmt::format("the last checkpoint in '{}' is of step {}", o_.checkpoint_dir, last_saved_);
}

Status RankRun::save(std::int64_t step, double lr) {
  Status s = save_checkpoint(b_, *engine_, leader_, m_, p_, o_, step, data_->state(), run_);
  if (!s.ok()) return make_error("step {} (lr {:g}): {}; {}", step, lr, s.error().message(), checkpoint_note());
  last_saved_ = step;
  last_words::set_saved_step(step);
  return s;
}

Result<StepResult> RankRun::train_step(std::int64_t step, double lr) {
  MT_ASSIGN(std::vector<HostBatch> batches, data_->next(share_.micro_batch, share_.count));
  faults_.begin_step(step);
  last_words::set_step(step, o_.steps);
  timer_.begin_step();
  std::optional<Result<StepResult>> result;
  try {
    result.emplace(engine_->step(batches, static_cast<float>(lr), step));
  } catch (const InjectedExit&) {
    // A rank thread that "died": its peers find out on their own; the run must not end in success.
    Error died = make_error("rank {} died at step {} of {} (--fault-inject), so the run did not complete its "
                            "steps; {}", b_.rank(), step, o_.steps, checkpoint_note());
    if (o_.rank_losses) o_.rank_losses->record_death(b_.rank(), step, died.message());
    return died;
  } catch (const std::bad_alloc&) {
    throw;  // main names it: out of memory
  } catch (const std::exception& e) {
    // A bug's exception, caught here rather than in main so that the error (under MPI, the job's abort) names
    // the rank, the step and the last checkpoint.
    if (o_.rank_losses) o_.rank_losses->record_failure(step);
    return make_error("step {}: uncaught exception (please report it): {}; {}", step, e.what(), checkpoint_note());
  }
  if (!result->ok()) {
    if (o_.rank_losses) o_.rank_losses->record_failure(step);
    // The engine names the step where its read failed; elsewhere it is added here.
    const std::string& what = result->error().message();
    const std::string where = fmt::format("step {}: ", step);
    return make_error("{}{}; {}", what.starts_with(where) ? "" : where, what, checkpoint_note());
  }
  return std::move(*result);
}

Result<StepMetrics> RankRun::measure(const StepResult& r, std::int64_t step, double lr, Clock::time_point t0) {
  MT_ASSIGN(const RankTiming timing, timer_.end_step());
  StepMetrics sm{step, r.loss, lr, seconds_since(t0), 0, std::nullopt};
  sm.tokens_per_s = tokens_per_step_ / sm.step_time_s;
  if (p_.world_size() > 1) {
    auto gathered = gather_timings(b_, timing, world_).context(fmt::format("step {}", step));
    if (!gathered.ok() && o_.rank_losses) o_.rank_losses->record_failure(step);
    MT_ASSIGN(std::vector<RankTiming> all, std::move(gathered));
    sm.ranks = rank_times(straggler_report(std::move(all), stage_));
  }
  if (io_.routes_to_experts) {
    const MoeStepStats& e = r.moe;
    sm.moe = MoeMetrics{e.aux_loss,           e.z_loss,
                        e.balance,            e.load_max_over_mean,
                        e.load_mean_max_over_mean, e.dropped_fraction,
                        e.tokens_per_expert};
  }
  if (o_.eval_every > 0 && (step % o_.eval_every == 0 || step == last_step_)) {
    MT_ASSIGN(Evaluation v, engine_->evaluate_metrics(val_));
    sm.val_loss = v.loss;
    if (io_.reports_accuracy) sm.val_accuracy = v.accuracy;
  }
  return sm;
}

void RankRun::add_to_summary(const StepMetrics& sm) {
  summary_.tokens += tokens_per_step_;
  summary_.step_seconds += sm.step_time_s;
  summary_.final_loss = sm.loss;
  if (sm.val_loss) summary_.final_val_loss = sm.val_loss;
  if (sm.val_accuracy) summary_.final_val_accuracy = sm.val_accuracy;
}

Result<bool> RankRun::record(const StepMetrics& sm, double lr) {
  const std::int64_t step = sm.step;
  const bool due =
      checkpointing() && ((o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) || step == last_step_);
  if (due) MT_TRY(save(step, lr));
  if (leader_) {
    if (metrics_) MT_TRY(metrics_->write(sm));
    if (o_.progress) {
      fmt::print("{}\n", progress_line(sm, o_.steps, seconds_since(start_), data_->unit(), m_.capacity_factor > 0));
      std::fflush(stdout);
    }
  }
  return due;
}

Status RankRun::stop_if_requested(std::int64_t step, double lr, bool saved) {
  MT_ASSIGN(const int signal, stop_vote_->agree().context(fmt::format("after step {}", step)));
  if (signal == 0) return ok_status();
  // Every rank stops after this step: save it (unless just saved), and let
  // no rank leave before the leader's commit is on disk.
  Status saving = checkpointing() && !saved ? save(step, lr) : ok_status();
  MT_TRY(stop_vote_->barrier());
  MT_TRY(saving);
  return make_error("stopped by {} after step {} of {}; {}{}", stop_signal_name(signal), step, o_.steps,
                    checkpoint_note(), checkpointing() ? ": continue it with --resume" : "");
}

Status RankRun::train() {
  start_ = Clock::now();
  summary_.first_step = first_step_, summary_.last_step = last_step_, summary_.total_steps = o_.steps;
  summary_.flops_per_token = training_flops(m_, 1, seq_, p_.recompute).per_token;
  summary_.peak_flops = o_.peak_flops, summary_.peak_source = o_.peak_source, summary_.unit = data_->unit();
  summary_.checkpoint = o_.checkpoint_dir, summary_.metrics = o_.metrics;
  for (std::int64_t step = first_step_; step <= last_step_; ++step) {
    const auto t0 = Clock::now();
    const double lr = lr_at(schedule_, static_cast<int>(step));
    MT_ASSIGN(const StepResult result, train_step(step, lr));
    MT_ASSIGN(const StepMetrics sm, measure(result, step, lr, t0));
    add_to_summary(sm);
    MT_ASSIGN(const bool saved, record(sm, lr));
    last_words::set_step(step, o_.steps, true);
    if (step == last_step_) break;
    MT_TRY(stop_if_requested(step, lr, saved));
  }
  MT_TRY(b_.synchronize());
  if (leader_ && first_step_ <= last_step_) {
    summary_.wall_seconds = seconds_since(run_start_);
    summary_.checkpoint_step = last_saved_;
    fmt::print("{}", format_run_summary(summary_));
    std::fflush(stdout);
  }
  return ok_status();
}

}  // namespace

Status train_rank(Backend& b, const ModelSpec& m, const Plan& p, const TrainOptions& o) {
  RankRun run(b, m, p, o);
  MT_TRY(run.open());
  return run.train();
}

}  // namespace meshtrain
