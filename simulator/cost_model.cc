#include "simulator/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace meshtrain::sim {
namespace {

double saturate(double x, double half) { return x / (x + half); }

// Output tiles (rows × columns per SM) among which cuBLAS and CUTLASS pick
// for an sm_80/sm_90 GEMM, a kernel property, not fitted. The model charges
// a tile only its FLOPs and its output, not the operand traffic that makes
// small tiles slower per FLOP on the hardware, so the smallest tiles tie or
// win: the choice bounds what padding and the last wave waste, and is
// optimistic for shapes the large tiles would leave ragged.
struct Tile {
  double m, n;
};
constexpr Tile kGemmTiles[] = {{128, 256}, {256, 128}, {128, 128}, {128, 64}, {64, 128}};

// Bytes of one output element: bf16 for bf16 and fp8 operands (Transformer
// Engine's FP8 GEMMs write bf16), fp32 for fp32.
double output_bytes(DType d) { return d == DType::kFp32 ? 4.0 : 2.0; }

// Bytes an epilogue moves per output element.
double epilogue_bytes(DType d, const GemmOutput& out) {
  return (out.bytes > 0 ? out.bytes : output_bytes(d)) * (out.accumulate ? 2.0 : 1.0);
}

double tiles_over(std::int64_t extent, double tile) { return std::ceil(static_cast<double>(extent) / tile); }
double elem_bytes(DType d) {
  switch (d) {
    case DType::kBf16: return 2.0;
    case DType::kFp8:
    case DType::kFp8Split: return 1.0;  // operands; the bf16 output is counted as 1 too (a small share)
    case DType::kFp32: return 4.0;
  }
  return 4.0;
}

}  // namespace

CostModel::CostModel(DeviceSpec device, CostConstants constants, const Calibration* calibration)
    : device_(std::move(device)), constants_(constants), calibration_(calibration) {}

double CostModel::peak_flops(DType dtype) const {
  switch (dtype) {
    case DType::kBf16: return device_.peak_bf16_flops;
    case DType::kFp8:
    case DType::kFp8Split: return device_.peak_fp8_flops;
    case DType::kFp32: return device_.peak_fp32_flops;
  }
  return device_.peak_fp32_flops;
}

double CostModel::tiled_efficiency(const std::vector<GemmGroup>& groups, int64_t n, DType dtype,
                                   const GemmOutput& out) const {
  const double sms = device_.sm_count;
  const double main_rate = peak_flops(dtype) / sms * constants_.gemm_mainloop_efficiency;
  const double store_rate = device_.memory_bandwidth / sms;
  double flops = 0;
  for (const auto& g : groups) flops += static_cast<double>(g.count) * gemm_flops(g.rows, n, g.k);
  double best = std::numeric_limits<double>::infinity();
  for (const Tile& t : kGemmTiles) {
    // Every group's tiles share the SMs (one launch); a wave runs sm_count
    // tiles, the last one partly empty. Groups of different k: the waves run
    // the mean tile, and no kernel is shorter than its longest tile.
    double tiles = 0, busy = 0, longest = 0;
    for (const auto& g : groups) {
      const double count = static_cast<double>(g.count) * tiles_over(g.rows, t.m) * tiles_over(n, t.n);
      const double tile = 2 * t.m * t.n * static_cast<double>(g.k) / main_rate +
                          epilogue_bytes(dtype, out) * t.m * t.n / store_rate;
      tiles += count;
      busy += count * tile;
      longest = std::max(longest, tile);
    }
    if (tiles > 0) best = std::min(best, std::max(std::ceil(tiles / sms) * busy / tiles, longest));
  }
  // The main loop's share of the kernel's time, at the sustained level.
  const double kept = flops / (best * peak_flops(dtype) * constants_.gemm_mainloop_efficiency);
  return constants_.gemm_efficiency_max * kept;
}

double CostModel::gemm_efficiency(int64_t m, int64_t n, int64_t k, DType dtype, int64_t batch,
                                  const GemmOutput& out) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  if (device_.sm_count > 0) return tiled_efficiency({{m, k, batch}}, n, dtype, out);
  const auto& c = constants_;
  return c.gemm_efficiency_max * saturate(static_cast<double>(m), c.gemm_m_half) *
         saturate(static_cast<double>(n), c.gemm_n_half) *
         saturate(static_cast<double>(k), c.gemm_k_half);
}

double CostModel::attention_efficiency(int64_t seq, int64_t head_dim) const {
  const auto& c = constants_;
  return c.attention_efficiency_max * saturate(static_cast<double>(seq), c.attention_seq_half) *
         saturate(static_cast<double>(head_dim), c.attention_head_dim_half);
}

Time CostModel::roofline(double flops, double bytes, double efficiency, DType dtype) const {
  const double compute = flops > 0 ? flops / (peak_flops(dtype) * efficiency) : 0;
  const double memory =
      bytes > 0 ? bytes / (device_.memory_bandwidth * constants_.memory_efficiency) : 0;
  return from_seconds(std::max(compute, memory)) + constants_.kernel_overhead;
}

template <class Lookup>
std::optional<Time> CostModel::measured(DType dtype, Lookup lookup) const {
  if (!calibration_) return std::nullopt;
  if (auto t = lookup(dtype)) return from_seconds(*t);
  // A split-accumulator FP8 kernel the file did not measure: its fast-accumulator twin's time (as the
  // model without a measurement has it).
  if (dtype == DType::kFp8Split) {
    if (auto t = lookup(DType::kFp8)) return from_seconds(*t);
    dtype = DType::kFp8;
  }
  // An FP8 kernel the file did not measure: the measured bf16 curve's efficiency at FP8's peak.
  if (dtype == DType::kFp8 && device_.peak_fp8_flops > 0)
    if (auto t = lookup(DType::kBf16)) return from_seconds(*t * device_.peak_bf16_flops / device_.peak_fp8_flops);
  return std::nullopt;
}

std::optional<Time> CostModel::measured_gemm(int64_t m, int64_t n, int64_t k, DType dtype) const {
  return measured(dtype, [&](DType d) { return calibration_->gemm_time(m, n, k, d); });
}

Time CostModel::gemm(int64_t m, int64_t n, int64_t k, DType dtype, int64_t batch, const GemmOutput& out) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  if (auto t = measured_gemm(m, n, k, dtype)) return *t * batch;
  const double b = static_cast<double>(batch);
  const double bytes = b * elem_bytes(dtype) * static_cast<double>(m * k + k * n + m * n);
  return roofline(b * gemm_flops(m, n, k), bytes, gemm_efficiency(m, n, k, dtype, batch, out), dtype);
}

Time CostModel::tiled_groups(const std::vector<GemmGroup>& groups, int64_t n, DType dtype, const GemmOutput& out) const {
  double flops = 0, bytes = 0;
  for (const auto& g : groups) {
    const double count = static_cast<double>(g.count);
    flops += count * gemm_flops(g.rows, n, g.k);
    bytes += count * elem_bytes(dtype) * static_cast<double>(g.rows * g.k + g.k * n + g.rows * n);
  }
  if (groups.empty() || n <= 0) return 0;
  return roofline(flops, bytes, tiled_efficiency(groups, n, dtype, out), dtype);
}

std::optional<Time> CostModel::measured_grouped_gemm(const std::vector<int64_t>& rows, int64_t n, int64_t k,
                                                     DType dtype, bool wgrad) const {
  return measured(dtype, [&](DType d) { return calibration_->grouped_gemm_time(rows, n, k, d, wgrad); });
}

Time CostModel::grouped_gemm(const std::vector<int64_t>& rows, int64_t n, int64_t k, DType dtype) const {
  if (auto t = measured_grouped_gemm(rows, n, k, dtype, false)) return *t;
  const int64_t tile = std::max<int64_t>(1, constants_.grouped_gemm_tile_rows);
  int64_t padded = 0;
  std::vector<GemmGroup> groups;
  for (int64_t m : rows) {
    if (m <= 0) continue;
    padded += (m + tile - 1) / tile * tile;
    groups.push_back({m, k, 1});
  }
  if (padded == 0 || n <= 0 || k <= 0) return 0;
  // Measured plain GEMMs, or no SMs to tile over: the padded total as one
  // GEMM (the same tiles, the same launch).
  if (device_.sm_count <= 0 || measured_gemm(padded, n, k, dtype)) return gemm(padded, n, k, dtype);
  return tiled_groups(groups, n, dtype);
}

Time CostModel::grouped_gemm_wgrad(const std::vector<int64_t>& tokens, int64_t m, int64_t n, DType dtype,
                                   const GemmOutput& out) const {
  // The measured entries' weight gradient is (k × n), reduced over each group's rows: k is this m.
  if (auto t = measured_grouped_gemm(tokens, n, m, dtype, true)) return *t;
  std::vector<GemmGroup> groups;
  for (int64_t t : tokens)
    if (t > 0) groups.push_back({m, t, 1});
  if (groups.empty() || m <= 0 || n <= 0) return 0;
  if (device_.sm_count > 0 && !measured_gemm(m, n, groups.front().k, dtype)) return tiled_groups(groups, n, dtype, out);
  // Each group's GEMM without its own launch: one launch for the kernel.
  Time total = 0;
  for (const auto& g : groups) total += std::max<Time>(gemm(m, n, g.k, dtype, 1, out) - constants_.kernel_overhead, 0);
  return total + constants_.kernel_overhead;
}

Time CostModel::attention(int64_t bh, int64_t seq, int64_t d, bool causal, bool backward,
                          DType dtype) const {
  if (bh <= 0 || seq <= 0 || d <= 0) return 0;
  const double factor = backward ? 2.5 : 1.0;
  if (calibration_) {
    if (backward)
      if (auto t = calibration_->attention_backward_time(bh, seq, d, causal))
        return from_seconds(*t);
    if (auto t = calibration_->attention_time(bh, seq, d, causal)) return from_seconds(*t * factor);
  }
  // Fused attention reads q, k, v and writes o (backward: also reads o, do and
  // writes dq, dk, dv): about 4 (backward 7) tensors of bh·s·d.
  const double tensors = backward ? 7.0 : 4.0;
  const double bytes = tensors * elem_bytes(dtype) * static_cast<double>(bh) *
                       static_cast<double>(seq) * static_cast<double>(d);
  return roofline(factor * attention_flops(bh, seq, d, causal), bytes, attention_efficiency(seq, d),
                  dtype);
}

double attention_window_share(int64_t seq, int64_t q_begin, int64_t q_rows, bool causal, int64_t sliding_window) {
  if (seq <= 0 || q_rows <= 0) return 0;
  const double T = static_cast<double>(seq), b = static_cast<double>(q_begin), n = static_cast<double>(q_rows);
  if (!causal) return n / T;
  // Row t scores min(t + 1, W) keys (W = T without a window): rows below W
  // add t + 1 each, Σ_{t=b}^{e-1} (t + 1) = (e - b)(b + e + 1)/2, the rest W.
  const double W = sliding_window > 0 ? std::min<double>(static_cast<double>(sliding_window), T) : T;
  const double e = std::min(b + n, W), growing = e > b ? (e - b) * (b + e + 1) / 2 : 0.0;
  const double full_rows = n - std::max(e - b, 0.0);
  return (growing + full_rows * W) / (T * (T + 1) / 2);
}

Time CostModel::attention_window(int64_t bh, int64_t seq, int64_t d, bool causal, bool backward, DType dtype,
                                 int64_t q_begin, int64_t q_rows, int64_t sliding_window) const {
  const Time full = attention(bh, seq, d, causal, backward, dtype);
  const bool windowed = causal && sliding_window > 0 && sliding_window < seq;
  if ((q_rows <= 0 || q_rows >= seq) && !windowed) return full;
  if (q_rows <= 0 || q_rows >= seq) q_begin = 0, q_rows = seq;
  // The launch overhead is paid once; the work scales with the scores (a
  // fused kernel skips the key blocks outside the window).
  const Time overhead = constants_.kernel_overhead;
  const double share = attention_window_share(seq, q_begin, q_rows, causal, sliding_window);
  return overhead + static_cast<Time>(static_cast<double>(std::max<Time>(full - overhead, 0)) * share);
}

Time CostModel::memory_bound(double bytes, std::string_view op) const {
  if (!(bytes > 0)) return 0;
  if (calibration_ && !op.empty())
    if (auto t = calibration_->op_time(op, bytes)) return from_seconds(*t);
  if (calibration_)
    if (auto t = calibration_->memory_time(bytes)) return from_seconds(*t);
  return roofline(0, bytes, 1.0, DType::kBf16);
}

Time CostModel::host_adamw(double bytes, int sharing) const {
  if (!(bytes > 0)) return 0;
  // A calibration measured it with its ranks sharing the host (Calibration::for_ranks_sharing): as is.
  if (calibration_)
    if (auto t = calibration_->op_time("host_adamw", bytes)) return from_seconds(*t);
  return from_seconds(bytes * static_cast<double>(std::max(sharing, 1)) / constants_.host_adamw_bandwidth);
}

}  // namespace meshtrain::sim
