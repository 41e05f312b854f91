// Goodput of a training run under failures and checkpoints (`meshtrain
// goodput`): how much of the wall time trains, given the iteration time, the
// checkpoint write time, the restart time and a failure rate, and the
// checkpoint interval that maximises it.
//
// Model (Daly 2006, "A higher order estimate of the optimum checkpoint
// interval for restart dumps", FGCS 22): failures arrive as a Poisson
// process of rate 1/M, M the job's mean time between failures (each of the
// N GPUs fails independently with MTBF H: M = H / N). Training runs in
// segments of τ seconds of work followed by a checkpoint of C seconds; a
// failure (also during a checkpoint or a restart) costs a restart of R
// seconds and the work since the last checkpoint. The expected wall time of
// a segment is then
//     E[T](τ) = M · e^{R/M} · (e^{(τ+C)/M} − 1),
// and goodput, the share of wall time that is training, is G(τ) = τ / E[T](τ).
// G is maximised where 1 − e^{−(τ+C)/M} = τ/M (solved numerically here).
// First-order approximations: Young (1974) τ* ≈ √(2·C·M), and Daly's
// τ* ≈ √(2CM)·(1 + √(C/2M)/3 + (C/2M)/9) − C for C < 2M; the exact optimum
// tends to both as C/M → 0.
//
// Intervals are given in steps (as `train --checkpoint-every`): τ = S ·
// iteration time. The checkpoint holds what `meshtrain train` writes: fp32
// parameters and both AdamW moments, 12 bytes per parameter.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace meshtrain {

struct GoodputInputs {
  double iteration_s = 0;         // one training step
  double checkpoint_s = 0;        // C: writing one checkpoint
  double restart_s = 0;           // R: from a failure to training again (with loading the checkpoint)
  double job_mtbf_s = 0;          // M: mean time between failures of the whole job
};

// Checks that every input is finite and positive (restart may be 0).
Status check_goodput_inputs(const GoodputInputs& in);

// G(τ) for τ seconds of work between checkpoints.
double goodput(const GoodputInputs& in, double interval_s);
// Expected wall seconds per second of training, 1 / G.
inline double wall_per_train_second(const GoodputInputs& in, double interval_s) {
  return 1.0 / goodput(in, interval_s);
}

// The τ that maximises G (the root of 1 − e^{−(τ+C)/M} = τ/M).
double optimal_interval_s(const GoodputInputs& in);
double young_interval_s(const GoodputInputs& in);  // √(2CM)
double daly_interval_s(const GoodputInputs& in);   // Daly's higher-order estimate (M for C >= 2M)

// Where the wall time of a run checkpointing every τ seconds of work goes,
// exactly (the shares sum to 1): training, G(τ) = τ / E[T]; writing the
// checkpoints that complete, C / E[T]; and failures, the rest: restarts,
// work redone and checkpoints cut short. When failures outpace the
// checkpoints E[T] overflows: training and checkpoints 0, failures 1.
struct WallShares {
  double training = 0, checkpoints = 0, failures = 0;
};
WallShares wall_shares(const GoodputInputs& in, double interval_s);

// Below this goodput (one hour of training in 10,000 hours of wall time) a
// run is reported as making no progress: failures come faster than the
// restarts and checkpoints can save any work.
inline constexpr double kNoProgressGoodput = 1e-4;

struct GoodputPlan {
  std::int64_t steps = 0;  // checkpoint every this many steps
  double interval_s = 0;   // steps · iteration
  double goodput = 0;
};
// The best whole number of steps between checkpoints (at least 1).
GoodputPlan optimal_steps(const GoodputInputs& in);
GoodputPlan at_steps(const GoodputInputs& in, std::int64_t steps);

// Bytes of a `meshtrain train` checkpoint of `parameters` parameters.
inline double checkpoint_bytes(double parameters) { return 12.0 * parameters; }

}  // namespace meshtrain
