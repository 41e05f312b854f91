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

class OpTimer final : public BackendWrapper {
 public:
  // `synchronize_each_op`: for an asynchronous backend, each op is timed from
  // an idle device to its completion (the first failed synchronize is kept in status()).
  explicit OpTimer(Backend& target, bool synchronize_each_op = false)
      : BackendWrapper(target), synchronize_(synchronize_each_op) {}
  const std::map<std::string, OpTotals>& totals() const { return totals_; }
  void reset() { totals_.clear(); }
  const Status& status() const { return status_; }

  void fill(Tensor& x, float v) override;
  void copy(const Tensor& s, Tensor& d) override;
  void cast(const Tensor& s, Tensor& d) override;
  void add(const Tensor& a, const Tensor& b, Tensor& o) override;
  void scale(Tensor& x, float a) override;
  void axpy(float a, const Tensor& x, Tensor& y) override;
  void sum(const Tensor& x, Tensor& o, float s, bool acc) override;
  void sum_squares(const Tensor& x, Tensor& o, bool acc) override;
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;
  void embedding_forward(const Tensor& t, const Tensor& ids, Tensor& o, std::int64_t off) override;
  void embedding_backward(const Tensor& d, const Tensor& ids, Tensor& dt, std::int64_t off) override;
  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& o, Tensor& m,
                         Tensor& r, float eps) override;
  void layernorm_backward(const Tensor& d, const Tensor& x, const Tensor& w, const Tensor& m,
                          const Tensor& r, Tensor& dx, Tensor& dw, Tensor& db) override;
  void gelu_forward(const Tensor& x, Tensor& o) override;
  void gelu_backward(const Tensor& d, const Tensor& x, Tensor& dx) override;
  void dropout_forward(const Tensor& x, Tensor& o, const DropoutOp& op) override;
  void dropout_backward(const Tensor& d, Tensor& dx, const DropoutOp& op) override;
  void gather_rows(const Tensor& s, const Tensor& i, Tensor& o) override;
  void moe_route(const Tensor& l, bool r, Tensor& p, Tensor& lse, Tensor& w, Tensor& e) override;
  void moe_route_backward(const Tensor& dw, const Tensor& p, const Tensor& lse, const Tensor& e, const Tensor& g,
                          float z, bool r, Tensor& dl) override;
  void moe_combine(const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& o) override;
  void moe_combine_backward(const Tensor& d, const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& dr,
                            Tensor& dw) override;
  void attention_forward(const Tensor& qkv, Tensor& o, Tensor& lse, const AttentionOp& op) override;
  void attention_backward(const Tensor& d, const Tensor& qkv, const Tensor& o, const Tensor& lse,
                          Tensor& dqkv, const AttentionOp& op) override;
  void cross_entropy_max(const Tensor& l, Tensor& m) override;
  void cross_entropy_partials(const Tensor& l, const Tensor& t, const Tensor& m, std::int64_t off,
                              Tensor& s, Tensor& tl) override;
  void cross_entropy_loss(const Tensor& m, const Tensor& s, const Tensor& tl, Tensor& l) override;
  void cross_entropy_backward(const Tensor& l, const Tensor& t, const Tensor& m, const Tensor& s,
                              std::int64_t off, float d, Tensor& dl) override;
  void cross_entropy_accuracy(const Tensor& m, const Tensor& tl, Tensor& c, bool acc) override;
  void clip_coefficient(const Tensor& s, float n, Tensor& c) override;
  void adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const Tensor& c,
             const AdamWOp& op) override;
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& o) override;
  void foreach_adamw(std::span<const AdamWTensors> ps, const Tensor& c, const AdamWOp& op) override;
  void sign_compress(const Tensor& x, Tensor& e, Tensor& p) override;
  void sign_decompress(const Tensor& p, Tensor& o) override;
  void write(Tensor& dst, std::span<const float> host) override;
  void write(Tensor& dst, std::span<const std::int32_t> host) override;

 private:
  template <class F>
  void timed(const char* name, F&& f);
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
