// The training loop of one rank: data, learning-rate schedule, StepEngine
// iterations, validation, metrics, progress and checkpoints.
//
// Every rank runs `train_rank` with its own backend; rank 0 alone prints,
// writes metrics and commits checkpoints (the state it saves is gathered by
// StepEngine::export_state, a collective that every rank joins).
//
// Each step is timed per rank (engine/training/step_timing.h); with several ranks
// every rank's compute and communication time is gathered after the step
// and rank 0 reports the slowest rank and its lag against the median, on the
// progress line and in --metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/plan/plan.h"
#include "engine/step/step_engine.h"
#include "engine/training/fault_injection.h"
#include "engine/training/lr_schedule.h"
#include "models/model_spec.h"

namespace meshtrain {

struct TrainOptions {
  std::string data;             // a language model: any file (byte tokens); a vision model: an image set
  int steps = 100;              // total optimizer steps (the LR schedule spans them)
  int stop_at = 0;              // > 0: stop after this step (a planned preemption)
  double lr = 1e-3, min_lr = 1e-4;
  std::optional<int> warmup;    // linear warm-up steps; unset: kDefaultWarmup, at most `steps`
  LrDecay lr_decay = LrDecay::cosine;  // the shape after the warm-up (engine/training/lr_schedule.h)
  int decay_steps = 0;          // 0: the shape's default
  std::uint64_t seed = 1234;
  std::string checkpoint_dir;   // empty: no checkpoints
  std::optional<CheckpointTokenizer> tokenizer;  // copied into checkpoint_dir; every manifest names it
  int checkpoint_every = 0;     // 0: only at the end
  bool resume = false;
  bool overwrite_checkpoint = false;  // start afresh, replacing a checkpoint in checkpoint_dir
  // --init-from: a run that starts at step 1 takes these full parameters (by
  // name, engine/export/hf_export.h) with zero AdamW moments; a resumed
  // checkpoint takes precedence. Loaded once per process, shared by its ranks.
  std::string init_from;
  std::shared_ptr<const std::map<std::string, std::vector<float>>> init_parameters;
  std::string metrics;          // JSON lines, appended
  int eval_every = 0;           // 0: no validation loss
  int eval_sequences = 16;      // held-out sequences per evaluation (text)
  int eval_images = 0;          // test images per evaluation (images; 0: the whole test set)
  bool progress = true;
  double peak_flops = 0;        // all ranks' peak FLOP/s, for the run summary's MFU; 0: unknown
  std::string peak_source;      // where peak_flops came from, as the summary names it
  StepOptions step;
  // Faults to inject (engine/training/fault_injection.h); an injected exit kills the
  // process when ranks are processes; an injected hang lasts 3x comm_timeout.
  std::vector<Fault> faults;
  bool ranks_are_processes = false;
  // Where rank threads record an injected death (shared by the run's ranks);
  // null: a rank that dies still fails, but alone names itself.
  std::shared_ptr<RankLosses> rank_losses;
  std::chrono::milliseconds comm_timeout{std::chrono::minutes(5)};
};

inline constexpr int kDefaultWarmup = 10;
// The warm-up the run uses: --warmup as given, else the default clamped to --steps.
int warmup_steps(const TrainOptions& o);

// The run's learning-rate schedule: --lr, --min-lr, the warm-up, --steps and the decay's shape.
LrSchedule lr_schedule(const TrainOptions& o);

// Validates the options against the data before any work (missing data,
// too short for one sequence, flags that do nothing or contradict, ...) and
// estimates the host memory the run needs: `host_ranks` ranks keep their
// model, optimizer state and activations in this process's memory (the cpu
// backend: every rank thread, or 1 under MPI; the cuda backend: 0). A run
// that cannot fit is refused with the figure before anything is allocated.
Status check_train_options(const TrainOptions& o, const ModelSpec& m, const Plan& p, int host_ranks);

// Claims o.checkpoint_dir for this run (claim_checkpoint_dir in
// engine/checkpoint.h: lock, and no checkpoint replaced unless asked), or
// nullopt without --checkpoint. The process of rank 0 (which writes the
// checkpoints) calls it before training and holds the lock until the end.
Result<std::optional<CheckpointLock>> claim_checkpoint(const TrainOptions& o);

// Trains one rank; rank 0 ends a finished run with its summary (engine/training/run_summary.h).
// A rank thread that dies by --fault-inject returns an error naming itself
// and the step (recorded in o.rank_losses), so that the run fails rather than
// ending early with success. A stop requested by SIGTERM or SIGINT (engine/training/stop_request.h)
// ends every rank after the same step, with a checkpoint when one is
// configured, and returns an Error saying where the run stopped.
Status train_rank(Backend& b, const ModelSpec& m, const Plan& p, const TrainOptions& o);

}  // namespace meshtrain
