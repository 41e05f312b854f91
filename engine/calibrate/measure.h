// What `meshtrain calibrate` measures, written against backends/backend.h
// only: the same functions time the cpu backend and, given one, the cuda
// backend. The driver (calibrate_command.cc) picks the backend, the shapes
// and how many ranks run at once; this file only times ops and turns the
// timings into calibration entries (simulator/calibration.h).
//
// Timing rule: a sample is `iters` back-to-back calls of one op followed by
// Backend::synchronize(), divided by iters; iters is chosen by a pilot run so
// that a sample lasts at least Timing::min_sample_s (so clock resolution and
// the synchronize are noise). Each call uses the next of several buffer sets
// (together > 32 MiB, at most 16), so that its inputs come from memory, not
// cache, as in a step where other ops ran in between. An entry records the median of `samples`
// samples (or their mean, Timing::mean) as time_us and their 10th/90th
// percentiles as the spread.
//
// Sharing: when several ranks measure at once (ranks as threads on one
// machine, each with its own backend), each calls the same function with the
// same shapes and a `sync` that is a barrier of all of them; every sample
// starts after a barrier, so the samples of the ranks overlap and the
// measured time includes the cores and memory bandwidth they take from each
// other. With one rank, `sync` does nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "simulator/calibration.h"

namespace meshtrain::calibrate {

struct Timing {
  int samples = 9;
  double min_sample_s = 2e-3;
  // time_us is the median of the samples (the op on an otherwise idle
  // machine: samples that other processes interrupted fall outside it), or,
  // with `mean`, their mean (the op under the machine's current load,
  // including the time other processes take from it).
  bool mean = false;
  // Cap on the bytes of the buffer sets an op cycles through (0: none).
  // Without it the sets span twice the last-level cache the machine reports,
  // which on a VM slice of a large server is the whole socket's L3 (512 MiB
  // here): gigabytes of fresh pages per op, whose first touch then dominates
  // a calibration's time. --quick caps it; its entries are less exact anyway.
  double max_cold_bytes = 0;
};

using Sync = std::function<void()>;

// Tensors are built at the dtypes a shape names: the run's precision for
// activations (bf16 on the cuda backend's mixed precision), fp32 where the
// engine keeps fp32 whatever the precision (statistics, weight gradients,
// optimizer state), as the backends require (backends/cuda/op_checks.h).

// (m, n, k) with the transposes and dtypes the engine issues them with: A and
// B at `in`, C at `out` (a bf16 step accumulates weight gradients into fp32).
struct GemmShape {
  std::int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  DType in = DType::f32, out = DType::f32;
  bool operator<(const GemmShape& o) const;
};
// One grouped GEMM over `groups` groups of `rows` rows each, as an MoE
// layer's experts issue it (models/moe_layer.cc): forward (and input
// gradient) c_g (rows×n) = a_g (rows×k)·b_g (k×n) at `in`; wgrad the weight
// gradients dW_g (k×n) += a_gᵀ·d_g, a_g (rows×k) and d_g (rows×n) at `in`,
// dW_g at `out` (fp32 in a bf16 step).
struct GroupedGemmShape {
  std::int64_t groups, rows, n, k;
  bool wgrad = false;
  DType in = DType::f32, out = DType::f32;
  bool operator<(const GroupedGemmShape& o) const;
};
// Attention over batch·heads sequences (kv heads = heads), causal or not.
// windows > 0: the attention also carries Swin's score terms (a (T, T, H)
// bias, and a (windows, T, T) mask on the shifted blocks), whose extra time
// is measured too.
struct AttentionShape {
  std::int64_t batch, heads, seq, head_dim;
  bool causal = true;
  std::int64_t windows = 0;
  DType dtype = DType::f32;  // of q, k, v, the output and their gradients
  bool operator<(const AttentionShape& o) const;
};
// A memory-bound op on (rows, cols) tensors; the op decides what the tensors
// are. `dtype` is that of its activation-like tensors (cast: its output's,
// from fp32, or to fp32 from bf16); the optimizer's ops, the loss statistics
// and the gradient compression are fp32 whatever it says, as in the step.
struct OpShape {
  std::string op;
  std::int64_t rows, cols;
  DType dtype = DType::f32;
  bool operator<(const OpShape& o) const;
};

// The simulator's cost dtype of a backend dtype (fp16 costs as bf16).
sim::DType sim_dtype(DType d);

// The ops measured one by one, by their cost names: one per cost name of the
// op table's memory-bound and host ops (backends/op_table.h, per_op_measured).
const std::vector<std::string>& measured_ops();

// Each function returns one entry per shape, in shape order. `progress(i)`
// is called after shape i (for the progress line). Results carry
// ranks_sharing = `sharing`.
using Progress = std::function<void(std::size_t done)>;
Result<std::vector<sim::Calibration::Gemm>> measure_gemm(Backend& b,
                                                         const std::vector<GemmShape>& shapes,
                                                         const Timing& t, const Sync& sync,
                                                         int sharing, const Progress& progress);
// One FP8 GEMM (m, n, k) on b's device with the fast or the split accumulator, as a call to time
// (backend_fp8_gemm_call: the cuda backend's cuBLASLt GEMM).
using Fp8GemmCall = std::function<Result<std::function<void()>>(std::int64_t m, std::int64_t n, std::int64_t k,
                                                                 bool split_accumulator)>;
// FP8 GEMMs as Transformer Engine runs a linear's: per shape of 16-bit
// operands whose dimensions are multiples of 16 (cuBLASLt's FP8 kernels need
// them), its (m, n, k) with E4M3 operands made by `make`, once with the fast
// accumulator (dtype fp8, TE's forward) and once with the split one
// (fp8_split, its dgrad and wgrad). An error where the device has none (the
// caller notes it and goes on without them).
Result<std::vector<sim::Calibration::Gemm>> measure_fp8_gemm(Backend& b, const std::vector<GemmShape>& shapes,
                                                             const Fp8GemmCall& make, const Timing& t,
                                                             const Progress& progress);
// One grouped_gemm entry per shape, the backend's grouped_gemm timed as a whole.
Result<std::vector<sim::Calibration::GroupedGemm>> measure_grouped_gemm(
    Backend& b, const std::vector<GroupedGemmShape>& shapes, const Timing& t, const Sync& sync, int sharing,
    const Progress& progress);
// Forward and backward entries for each shape; for shapes with score terms
// also "attention_score_terms" ops entries in `score_terms`: the time a bias
// (and a bias and a mask) add to the plain attention, forward and backward,
// at the bytes the sim backend counts for them.
Result<std::vector<sim::Calibration::Attention>> measure_attention(
    Backend& b, const std::vector<AttentionShape>& shapes, const Timing& t, const Sync& sync,
    int sharing, const Progress& progress, std::vector<sim::Calibration::Op>& score_terms);
// One "ops" entry per shape (bytes counted as the sim backend counts them).
Result<std::vector<sim::Calibration::Op>> measure_ops(Backend& b, const std::vector<OpShape>& shapes,
                                                      const Timing& t, const Sync& sync,
                                                      int sharing, const Progress& progress);

// Collectives and send/recv among the members of `g` (every member calls
// this with the same arguments; b.rank() is one of g.ranks): one entry per
// (kind, bytes), busbw from the median time of one call, spread of that
// time. send/recv runs between g.ranks[0] and g.ranks[1] (the others wait)
// and gives kind send_recv with busbw = bytes / time.
Result<std::vector<sim::Calibration::Collective>> measure_collectives(
    Backend& b, const Group& g, const std::vector<double>& bytes, const Timing& t,
    const std::string& transport, const Progress& progress);

// Small-message one-way latency (half the ping-pong round trip of 4 bytes)
// and large-message bandwidth of send/recv between g.ranks[0] and [1], in
// µs and GB/s; other members only take part in the barriers.
Result<sim::Calibration::Link> measure_link(Backend& b, const Group& g, double bytes,
                                            const Timing& t);

}  // namespace meshtrain::calibrate
