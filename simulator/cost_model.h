// Kernel times from a roofline with shape-dependent efficiency, replaced by
// measured times from a calibration where it has them.
//
//   time = max(flops / (peak(dtype) · eff(shape)), bytes / (mem_bw · memory_efficiency))
//          + kernel_overhead
//
// with, for a GEMM C(m×n) = A(m×k)·B(k×n) (2mnk FLOPs, bytes = (mk + kn + mn)·elem),
// on a device with SMs, the tile model: for each output tile tm×tn the
// kernels offer (128×256 ... 64×128), the SMs run ⌈m/tm⌉·⌈n/tn⌉ tiles in
// waves of sm_count, a tile taking
//   2·tm·tn·k / (peak/sms · mainloop_eff)  +  out_bytes·tm·tn / (hbm_bw/sms)
// (main loop, then the epilogue storing the tile); the best tile's time T
// gives
//   eff(m,n,k) = gemm_efficiency_max · 2mnk / (T · peak · mainloop_eff)
// so large GEMMs approach gemm_efficiency_max and small ones lose to
// partial waves and epilogues, more on a faster device or at FP8's doubled
// peak (the epilogue does not speed up). Grouped GEMMs count every group's
// tiles in one launch. On a device without SMs (the cpu):
//   eff(m,n,k) = gemm_efficiency_max · m/(m+m_half) · n/(n+n_half) · k/(k+k_half)
// For attention
// (4·bh·s²·d FLOPs, half when causal; backward 2.5× forward as in
// FlashAttention-2: five matmuls instead of two):
//   eff = attention_efficiency_max · s/(s+seq_half) · d/(d+head_dim_half)
// All constants are in CostConstants (constants.h).
//
// With a calibration, a measured (or interpolated, see calibration.h) time
// replaces the roofline for GEMM, grouped GEMM, attention and memory-bound kernels; the
// roofline stays the fallback for kinds with no measurements. A measured
// attention backward is used as such; without one, backward is 2.5x the
// measured forward.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "simulator/calibration.h"
#include "simulator/cluster_spec.h"
#include "simulator/constants.h"

namespace meshtrain::sim {

// The share of a sequence's attention scores that its query rows [q_begin,
// q_begin + q_rows) compute: causal, row t scores keys 0..t, so the window
// holds Σ_{t in window} (t + 1) of the T(T + 1)/2; otherwise q_rows / T.
// With a sliding window W (causal only) row t scores min(t + 1, W) keys.
double attention_window_share(int64_t seq, int64_t q_begin, int64_t q_rows, bool causal,
                              int64_t sliding_window = 0);

// What a GEMM's epilogue does with each output element: store it at
// `bytes` (0: 2 for bf16 and fp8 operands, 4 for fp32), after reading the
// element already there when it accumulates (C += A·B: a weight gradient
// summed into its gradient over micro-batches, fp32 or bf16, Megatron's
// gradient_accumulation_fusion). Only the tile model reads it: a measured
// GEMM's time and the saturating curve (no SMs) stand as they are.
struct GemmOutput {
  double bytes = 0;
  bool accumulate = false;
};

class CostModel {
 public:
  // `calibration` may be null; when not, it must outlive the model.
  CostModel(DeviceSpec device, CostConstants constants, const Calibration* calibration = nullptr);

  const CostConstants& constants() const { return constants_; }
  const DeviceSpec& device() const { return device_; }

  double peak_flops(DType dtype) const;
  // The share of peak(dtype) that `batch` (m,n,k) GEMMs sustain: on a
  // device with SMs the tile model (constants.h, gemm_mainloop_efficiency),
  // else the saturating shape curve.
  double gemm_efficiency(int64_t m, int64_t n, int64_t k, DType dtype = DType::kBf16, int64_t batch = 1,
                         const GemmOutput& out = {}) const;
  double attention_efficiency(int64_t seq, int64_t head_dim) const;

  // One GEMM of `batch` independent (m,n,k) products.
  Time gemm(int64_t m, int64_t n, int64_t k, DType dtype, int64_t batch = 1, const GemmOutput& out = {}) const;
  // One grouped GEMM over groups of rows[g] × k by k × n (MoE experts over
  // their tokens, forward or input gradient). With a calibration holding
  // grouped_gemm entries of the dtype: the sum over groups of each one's
  // FLOPs at the measured grouped throughput of its rows per group
  // (Calibration::grouped_gemm_time). Otherwise, with SMs, the tile model
  // over every group's tiles in one launch; without, every group's rows
  // padded to CostConstants::grouped_gemm_tile_rows and run as one GEMM of
  // the padded total would (its efficiency, or its measured time from a
  // calibration's gemm table). Either way empty groups cost nothing and a
  // group of many rows more than one of few.
  Time grouped_gemm(const std::vector<int64_t>& rows, int64_t n, int64_t k, DType dtype) const;
  // The weight gradients of such groups: dW_g (m × n) = a_gᵀ d_g, each a
  // GEMM whose reduction runs over the group's tokens[g]. Measured: the
  // calibration's wgrad entries as above; otherwise, with SMs, every
  // group's tiles (each reducing over its own tokens) in one launch; without,
  // each group's GEMM at its own efficiency, launched once.
  Time grouped_gemm_wgrad(const std::vector<int64_t>& tokens, int64_t m, int64_t n, DType dtype,
                          const GemmOutput& out = {}) const;
  // Fused attention over batch·heads sequences of `seq` with head size `head_dim`.
  Time attention(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal, bool backward,
                 DType dtype) const;
  // Attention computing only the query rows [q_begin, q_begin + q_rows) of
  // the sequence against its keys (a context-parallel rank's chunk): the
  // full attention's time times the window's share of its scores
  // (attention_window_share), also under a sliding window (0: none).
  Time attention_window(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal, bool backward,
                        DType dtype, int64_t q_begin, int64_t q_rows, int64_t sliding_window = 0) const;
  // A memory-bound kernel (element-wise, norm, softmax, copy, optimizer) moving `bytes`.
  // `op` (a backend op name) selects the calibration's per-op table when it
  // measured that op; otherwise the by-bytes memory table, then the roofline.
  Time memory_bound(double bytes, std::string_view op = {}) const;
  // An AdamW step on the host's CPUs (optimizer offload) over `bytes` (as
  // the adamw op counts them), while `sharing` ranks of the node run theirs
  // at once: the calibration's "host_adamw" op as measured (`meshtrain
  // calibrate` times it at each ranks-sharing level, so the level picked
  // for the simulation holds the sharing), else
  // CostConstants::host_adamw_bandwidth divided among the sharers.
  Time host_adamw(double bytes, int sharing) const;
  // The bare roofline for given work, for kernels with their own FLOP count.
  Time roofline(double flops, double bytes, double efficiency, DType dtype) const;

 private:
  // `count` GEMMs of rows × n outputs reducing over k.
  struct GemmGroup {
    int64_t rows, k, count;
  };
  // The tile model's efficiency for groups that share one launch and the n columns.
  double tiled_efficiency(const std::vector<GemmGroup>& groups, int64_t n, DType dtype,
                          const GemmOutput& out = {}) const;
  // Such groups' kernel time: their FLOPs and bytes at that efficiency, one launch.
  Time tiled_groups(const std::vector<GemmGroup>& groups, int64_t n, DType dtype, const GemmOutput& out = {}) const;
  // A calibration's time from `lookup(dtype)` (seconds or nullopt), an FP8 one from lookup(kBf16) at FP8's peak.
  template <class Lookup>
  std::optional<Time> measured(DType dtype, Lookup lookup) const;
  // A calibration's time for one (m,n,k) GEMM (fp8 from bf16 entries at FP8's peak); nullopt without one.
  std::optional<Time> measured_gemm(int64_t m, int64_t n, int64_t k, DType dtype) const;
  // The calibration's grouped_gemm entries' time (fp8 from bf16 ones at FP8's peak); nullopt without them.
  std::optional<Time> measured_grouped_gemm(const std::vector<int64_t>& rows, int64_t n, int64_t k, DType dtype,
                                            bool wgrad) const;

  DeviceSpec device_;
  CostConstants constants_;
  const Calibration* calibration_;
};

}  // namespace meshtrain::sim
