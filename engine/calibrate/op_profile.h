// `meshtrain calibrate --profile MODEL:B:T --calibration FILE`: where does the
// simulator's time for a single-rank step differ from the real one, op kind
// by op kind?
//
// The real side runs StepEngine steps on the cpu backend through OpTimer, a
// BackendWrapper that times every op call on the host (the cpu backend runs
// ops eagerly, so the wall time of the call is the op's time). The simulated
// side is `meshtrain simulate` of the same plan on local-cpu with the
// calibration, its per-op durations read from the Chrome trace of rank 0.
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
  explicit OpTimer(Backend& target) : BackendWrapper(target) {}
  const std::map<std::string, OpTotals>& totals() const { return totals_; }
  void reset() { totals_.clear(); }

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
  std::map<std::string, OpTotals> totals_;
};

// Prints the per-op comparison for `workload` (MODEL:MICRO_BATCH:SEQ_LEN, one
// micro-batch per step) averaged over `steps` steps after two warm-up steps.
// With `ranks` > 1, that many independent single-rank engines run at once on
// their own threads (dp replicas without the gradient sync) and rank 0 is
// compared with the calibration's ranks_sharing = `ranks` tables. Each rank's
// backend has `rank_threads` threads (0: the cores shared out among the ranks, as
// `meshtrain train` shares them).
Status print_op_profile(const std::string& workload, const std::string& calibration_path,
                        int steps, int ranks, int rank_threads);

}  // namespace meshtrain::calibrate
