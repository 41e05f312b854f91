// `meshtrain calibrate --profile MODEL:B:T --calibration FILE`: where does the
// simulator's time for a single-rank step differ from the real one, op kind
// by op kind?
//
// The real side runs StepEngine steps on the backend the calibration was
// measured on (its machine.backend: cpu, or cuda on rank 0's GPU), at the
// calibration's precision, through OpTimer, a BackendWrapper that times every
// op call on the host (the cpu backend runs ops eagerly, so the wall time of
// the call is the op's time; the cuda backend's ops are asynchronous, so
// OpTimer synchronizes before and after each, and an op's time includes one
// synchronize, ~10-20 µs). The simulated side is `meshtrain simulate` of the
// same plan on the cluster preset of the calibration's device (local-cpu for
// the cpu backend) with the calibration, its per-op durations read from the
// Chrome trace of rank 0.
//
// Its cost is bounded: one warm-up step, then at most `steps` timed steps and
// no more once `budget_s` of timed steps have run (at least one). For the
// 1.21B gpt3-xl at B 8, T 1024, bf16 on an H200 (the 2026-12-04 run: 0.18 s a
// step unsynchronized) that is: engine set-up with the host-side parameter
// init ~37 s (measured there), the warm-up step ~1-2 s (cuBLASLt heuristics and
// the allocator's first blocks), 5 timed steps of ~0.2-0.3 s each (~1,000
// ops, each synchronized), one simulated iteration of one rank ~1 s: ~45 s.
// The cpu backend runs such a model at ~1 minute a step, so there it is for
// small models (the budget then stops after the first timed step).
// The report lists, per op kind, calls per step, real and simulated ms per
// step and their ratio, and the host time the real step spent outside any op
// (engine bookkeeping, allocation, data upload), which the simulator does
// not model.
#pragma once

#include <map>
#include <string>

#include "backends/backend_wrapper.h"
#include "core/status.h"

namespace meshtrain::calibrate {

struct OpTotals {
  double seconds = 0;
  long calls = 0;
};

// Times every op of the op table under its cost name (the name the
// simulator's trace gives it), and host writes.
class OpTimer final : public BackendWrapper {
 public:
  // `synchronize_each_op`: for an asynchronous backend, each op is timed from
  // an idle device to its completion (the first failed synchronize is kept in status()).
  explicit OpTimer(Backend& target, bool synchronize_each_op = false)
      : BackendWrapper(target), synchronize_(synchronize_each_op) {}
  const std::map<std::string, OpTotals>& totals() const { return totals_; }
  void reset() { totals_.clear(); }
  const Status& status() const { return status_; }

  void write(Tensor& dst, std::span<const float> host) override;
  void write(Tensor& dst, std::span<const std::int32_t> host) override;

 private:
  void on_op(const OpInfo& op, const OpArgs& args, const Call& call) override;
  template <class F>
  void timed(std::string_view name, F&& f);
  void sync();
  const bool synchronize_;
  std::map<std::string, OpTotals> totals_;
  Status status_ = ok_status();
};

struct ProfileOptions {
  std::string workload;     // MODEL:MICRO_BATCH:SEQ_LEN, one micro-batch per step
  std::string calibration;  // the file the simulation uses; its backend and precision are the real step's
  int steps = 5;            // timed steps at most
  double budget_s = 10;     // no further timed step once these seconds of timed steps have run
  int ranks = 1;            // cpu only: independent single-rank engines at once
  int rank_threads = 0;     // cpu only: threads per rank (0: the cores shared out among the ranks)
};

// Prints the per-op comparison for the workload averaged over the timed
// steps after one warm-up step. With `ranks` > 1 (cpu backend), that many
// independent single-rank engines run at once on their own threads (dp
// replicas without the gradient sync) and rank 0 is compared with the
// calibration's ranks_sharing = `ranks` tables. Each rank's backend has
// `rank_threads` threads (0: the cores shared out among the ranks, as
// `meshtrain train` shares them).
Status print_op_profile(const ProfileOptions& options);

}  // namespace meshtrain::calibrate
