#include "engine/calibrate/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <tuple>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/op_table.h"

namespace meshtrain::calibrate {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Median (or mean) and 10th/90th percentiles (nearest rank) of per-call seconds, in µs.
sim::Calibration::Spread spread_of(std::vector<double> s, int sharing, double& median_us,
                                   bool mean = false) {
  std::sort(s.begin(), s.end());
  auto at = [&](double q) {
    const auto i = static_cast<std::size_t>(std::lround(q * static_cast<double>(s.size() - 1)));
    return s[i] * 1e6;
  };
  median_us = at(0.5);
  if (mean) {
    double sum = 0;
    for (double x : s) sum += x;
    median_us = sum / static_cast<double>(s.size()) * 1e6;
  }
  return {at(0.1), at(0.9), static_cast<int>(s.size()), sharing};
}

// Calls needed for one sample of at least t.min_sample_s, from a pilot.
Result<int> pilot_iters(Backend& b, const std::function<void()>& op, const Timing& t) {
  op();  // warm-up: first touch of the buffers, lazy library init
  MT_TRY(b.synchronize());
  int iters = 1;
  for (;;) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) op();
    MT_TRY(b.synchronize());
    const double s = since(t0);
    if (s >= t.min_sample_s || iters >= (1 << 20)) return iters;
    iters = s <= 0 ? iters * 8
                   : std::min(iters * 8, std::max(iters + 1, static_cast<int>(
                                                                 iters * t.min_sample_s / s * 1.2)));
  }
}

// Per-call seconds of `samples` samples of `iters` calls, each after sync().
Result<std::vector<double>> samples_of(Backend& b, const std::function<void()>& op, int iters,
                                       const Timing& t, const Sync& sync) {
  std::vector<double> out;
  for (int s = 0; s < t.samples; ++s) {
    if (sync) sync();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) op();
    MT_TRY(b.synchronize());
    out.push_back(since(t0) / iters);
  }
  return out;
}

Result<std::pair<double, sim::Calibration::Spread>> time_op(Backend& b,
                                                           const std::function<void()>& op,
                                                           const Timing& t, const Sync& sync,
                                                           int sharing) {
  MT_ASSIGN(int iters, pilot_iters(b, op, t));
  MT_ASSIGN(std::vector<double> s, samples_of(b, op, iters, t, sync));
  double median = 0;
  auto spread = spread_of(std::move(s), sharing, median, t.mean);
  return std::make_pair(median, spread);
}

Tensor filled(Backend& b, Shape s, float v, DType dtype = DType::f32) {
  Tensor x = b.empty(s, dtype);
  b.fill(x, v);
  return x;
}

// Buffer sets an op cycles through so that its inputs are in the cache state
// they have inside a training step. Measured on this machine (RESULTS.md,
// issue 7): memory-bound ops find their operands beyond the L3 — with 16 sets
// (6 MB of `add` operands, inside the 32 MiB L3) the calibration timed residual
// adds and bias gradients at a third of their time in a real step, with sets
// past twice the L3 they match it; GEMMs find theirs in the L3 — sets past it
// made them 20-25% slower than in the step, a working set of about 16 sets
// under it matches.
enum class Residency { kL3, kBeyondL3 };
double last_level_cache_bytes() {
  static const double bytes = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return std::max(16.0 * (1 << 20), static_cast<double>(l3 > 0 ? l3 : 0));
  }();
  return bytes;
}
int cold_sets(double set_bytes, Residency r, const Timing& t) {
  double target = r == Residency::kL3 ? last_level_cache_bytes() : 2 * last_level_cache_bytes();
  if (t.max_cold_bytes > 0) target = std::min(target, t.max_cold_bytes);
  const double max_sets = r == Residency::kL3 ? 16.0 : 256.0;
  return static_cast<int>(std::clamp(std::ceil(target / std::max(set_bytes, 1.0)), 1.0, max_sets));
}

// One call per invocation, cycling through `calls`.
std::function<void()> rotating(std::vector<std::function<void()>> calls) {
  return [calls = std::move(calls), i = std::size_t{0}]() mutable {
    calls[i]();
    i = (i + 1) % calls.size();
  };
}

// A GEMM's time as a step finds its operands, in the L3: `make` builds one call on operands of its own,
// for each of the cold_sets of `set_bytes`, and time_op cycles through them.
Result<std::pair<double, sim::Calibration::Spread>> time_in_l3(Backend& b, double set_bytes,
                                                               const std::function<Result<std::function<void()>>()>& make,
                                                               const Timing& t, const Sync& sync, int sharing) {
  std::vector<std::function<void()>> calls;
  for (int c = 0; c < cold_sets(set_bytes, Residency::kL3, t); ++c) {
    MT_ASSIGN(std::function<void()> call, make());
    calls.push_back(std::move(call));
  }
  return time_op(b, rotating(std::move(calls)), t, sync, sharing);
}

// Members 0 and 1 of g exchange x once each way under `tag` (0 sends first):
// the round trip that send/recv and link timing measure.
// `count` samples of a communication op on group g: each after a barrier of
// the group, the seconds per call of `iters` calls, synchronized.
Result<std::vector<double>> samples_after_barriers(Backend& b, const Group& g, int count, int iters,
                                                   const std::function<void()>& op) {
  std::vector<double> samples;
  for (int s = 0; s < count; ++s) {
    b.barrier(g);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) op();
    MT_TRY(b.synchronize());
    samples.push_back(since(t0) / iters);
  }
  return samples;
}

void round_trip(Backend& b, Tensor& x, const Group& g, int me, int tag) {
  if (me == 0) {
    b.send(x, g.ranks[1], tag);
    b.recv(x, g.ranks[1], tag);
  } else {
    b.recv(x, g.ranks[0], tag);
    b.send(x, g.ranks[0], tag);
  }
}

}  // namespace

bool GemmShape::operator<(const GemmShape& o) const {
  return std::tie(m, n, k, trans_a, trans_b, in, out) < std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b, o.in, o.out);
}
bool GroupedGemmShape::operator<(const GroupedGemmShape& o) const {
  return std::tie(groups, rows, n, k, wgrad, in, out) < std::tie(o.groups, o.rows, o.n, o.k, o.wgrad, o.in, o.out);
}
bool AttentionShape::operator<(const AttentionShape& o) const {
  return std::tie(batch, heads, seq, head_dim, causal, windows, dtype) <
         std::tie(o.batch, o.heads, o.seq, o.head_dim, o.causal, o.windows, o.dtype);
}
bool OpShape::operator<(const OpShape& o) const {
  return std::tie(op, rows, cols, dtype) < std::tie(o.op, o.rows, o.cols, o.dtype);
}

sim::DType sim_dtype(DType d) { return d == DType::f32 ? sim::DType::kFp32 : sim::DType::kBf16; }

const std::vector<std::string>& measured_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> names;
    for (const OpInfo* op : per_op_measured()) names.emplace_back(op->cost_name);
    return names;
  }();
  return ops;
}

Result<std::vector<sim::Calibration::Gemm>> measure_gemm(Backend& b,
                                                         const std::vector<GemmShape>& shapes,
                                                         const Timing& t, const Sync& sync,
                                                         int sharing, const Progress& progress) {
  std::vector<sim::Calibration::Gemm> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape& g = shapes[i];
    const auto in = static_cast<double>(dtype_size(g.in)), out_size = static_cast<double>(dtype_size(g.out));
    const double set_bytes = in * static_cast<double>(g.m * g.k + g.k * g.n) + out_size * static_cast<double>(g.m * g.n);
    auto call = [&]() -> Result<std::function<void()>> {
      Tensor x = filled(b, g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, 0.01f, g.in);
      Tensor w = filled(b, g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 0.01f, g.in);
      Tensor y = filled(b, Shape{g.m, g.n}, 0.f, g.out);
      const GemmOp op{g.trans_a, g.trans_b, 1.f, 0.f, Tensor{}};
      return std::function<void()>([=, &b]() mutable { b.gemm(x, w, y, op); });
    };
    MT_ASSIGN(auto r, time_in_l3(b, set_bytes, call, t, sync, sharing));
    out.push_back({g.m, g.n, g.k, sim_dtype(g.in), r.first, r.second});
    if (progress) progress(i + 1);
  }
  return out;
}

Result<std::vector<sim::Calibration::Gemm>> measure_fp8_gemm(Backend& b, const std::vector<GemmShape>& shapes,
                                                             const Fp8GemmCall& make, const Timing& t,
                                                             const Progress& progress) {
  std::vector<sim::Calibration::Gemm> out;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> done;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape& g = shapes[i];
    const bool sixteen = g.m % 16 == 0 && g.n % 16 == 0 && g.k % 16 == 0;
    if (g.in == DType::f32 || !sixteen || !done.insert({g.m, g.n, g.k}).second) {
      if (progress) progress(i + 1);
      continue;
    }
    // Operands of one byte, the bf16 output.
    const double set_bytes = static_cast<double>(g.m * g.k + g.n * g.k) + 2.0 * static_cast<double>(g.m * g.n);
    for (const bool split : {false, true}) {
      MT_ASSIGN(auto r, time_in_l3(b, set_bytes, [&] { return make(g.m, g.n, g.k, split); }, t, {}, 1));
      out.push_back({g.m, g.n, g.k, split ? sim::DType::kFp8Split : sim::DType::kFp8, r.first, r.second});
    }
    if (progress) progress(i + 1);
  }
  return out;
}

namespace {

// One call of the grouped GEMM `g` on fresh operands: forward c_g = a_g·b_g, or wgrad dW_g += a_gᵀ·d_g.
std::function<void()> grouped_call(Backend& b, const GroupedGemmShape& g) {
  std::vector<Tensor> a, w, c;
  for (std::int64_t e = 0; e < g.groups; ++e) {
    a.push_back(filled(b, Shape{g.rows, g.k}, 0.01f, g.in));
    w.push_back(filled(b, g.wgrad ? Shape{g.rows, g.n} : Shape{g.k, g.n}, 0.01f, g.in));
    c.push_back(g.wgrad ? filled(b, Shape{g.k, g.n}, 0.f, g.out) : filled(b, Shape{g.rows, g.n}, 0.f, g.in));
  }
  const GemmOp op{g.wgrad, false, 1.f, g.wgrad ? 1.f : 0.f, Tensor{}};
  return [=, &b]() mutable { b.grouped_gemm(a, w, c, op); };
}

}  // namespace

Result<std::vector<sim::Calibration::GroupedGemm>> measure_grouped_gemm(
    Backend& b, const std::vector<GroupedGemmShape>& shapes, const Timing& t, const Sync& sync, int sharing,
    const Progress& progress) {
  std::vector<sim::Calibration::GroupedGemm> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const GroupedGemmShape& g = shapes[i];
    const auto in = static_cast<double>(dtype_size(g.in));
    const double c_bytes = g.wgrad ? static_cast<double>(dtype_size(g.out)) * static_cast<double>(g.k * g.n)
                                   : in * static_cast<double>(g.rows * g.n);
    const double b_bytes = in * static_cast<double>(g.wgrad ? g.rows * g.n : g.k * g.n);
    const double set_bytes =
        static_cast<double>(g.groups) * (in * static_cast<double>(g.rows * g.k) + b_bytes + c_bytes);
    MT_ASSIGN(auto r, time_in_l3(b, set_bytes, [&]() -> Result<std::function<void()>> { return grouped_call(b, g); },
                                 t, sync, sharing));
    out.push_back({g.groups, g.rows, g.n, g.k, sim_dtype(g.in), r.first, g.wgrad, r.second});
    if (progress) progress(i + 1);
  }
  return out;
}

namespace {

// µs to copy `bytes` (counted as the sim backend counts a copy: read and write) with the ops'
// timing rule; above 64 MiB a 64 MiB copy scaled linearly (streaming is linear past the cache),
// so that the floor of a large workload's terms needs no tensor of their size.
Result<double> streaming_floor_us(Backend& b, double bytes, const Timing& t, const Sync& sync, int sharing) {
  constexpr double kMaxBytes = 64.0 * (1 << 20);
  constexpr std::int64_t kCols = 256;
  const auto elements = static_cast<std::int64_t>(std::ceil(std::min(bytes, kMaxBytes) / 8));
  const std::int64_t rows = std::max<std::int64_t>(1, (elements + kCols - 1) / kCols);
  MT_ASSIGN(auto copy, measure_ops(b, {OpShape{"copy", rows, kCols}}, t, sync, sharing, {}));
  return copy.front().time_us * bytes / copy.front().bytes;
}

}  // namespace

Result<std::vector<sim::Calibration::Attention>> measure_attention(
    Backend& b, const std::vector<AttentionShape>& shapes, const Timing& t, const Sync& sync,
    int sharing, const Progress& progress, std::vector<sim::Calibration::Op>& score_terms) {
  std::vector<sim::Calibration::Attention> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const AttentionShape& s = shapes[i];
    const std::int64_t h = s.heads, d = s.head_dim;
    // The log-sum-exp statistics are fp32 at any precision (the cuda backend requires it).
    Tensor qkv = filled(b, Shape{s.batch, s.seq, 3 * h, d}, 0.01f, s.dtype);
    Tensor o = filled(b, Shape{s.batch, s.seq, h, d}, 0.f, s.dtype);
    Tensor lse = filled(b, Shape{s.batch, h, s.seq}, 0.f);
    Tensor dout = filled(b, Shape{s.batch, s.seq, h, d}, 0.01f, s.dtype);
    Tensor dqkv = filled(b, Shape{s.batch, s.seq, 3 * h, d}, 0.f, s.dtype);
    AttentionOp op;
    op.heads = op.kv_heads = static_cast<int>(h);
    op.head_dim = static_cast<int>(d);
    op.scale = 1.f / std::sqrt(static_cast<float>(d));
    op.causal = s.causal;
    auto time_pair = [&](const AttentionOp& a) -> Result<std::pair<sim::Calibration::Attention,
                                                                   sim::Calibration::Attention>> {
      MT_ASSIGN(auto f, time_op(b, [&] { b.attention_forward(qkv, o, lse, a); }, t, sync, sharing));
      MT_ASSIGN(auto bw, time_op(b, [&] { b.attention_backward(dout, qkv, o, lse, dqkv, a); }, t, sync, sharing));
      const std::int64_t bh = s.batch * h;
      return std::make_pair(sim::Calibration::Attention{bh, s.seq, d, s.causal, f.first, false, f.second},
                            sim::Calibration::Attention{bh, s.seq, d, s.causal, bw.first, true, bw.second});
    };
    MT_ASSIGN(auto plain, time_pair(op));
    out.push_back(plain.first);
    out.push_back(plain.second);
    if (s.windows > 0) {
      // The terms' own time: the scored attention's minus the plain one's, at the bytes the
      // simulator counts for them (backends/op_table.h's attention_score_term_bytes). That difference of two noisy times can be
      // tiny, zero or negative on a loaded machine (0.0 was written and then refused by the reader);
      // but the terms cannot take less than streaming their bytes once, so each is at least a copy of
      // that many bytes, measured here on the same backend and sharing.
      op.bias = filled(b, Shape{s.seq, s.seq, h}, 0.01f);
      op.dbias = filled(b, Shape{s.seq, s.seq, h}, 0.f);
      for (bool masked : {false, true}) {
        op.mask = masked ? filled(b, Shape{s.windows, s.seq, s.seq}, 0.f) : Tensor();
        MT_ASSIGN(auto scored, time_pair(op));
        const double forward_bytes = attention_score_term_bytes(s.batch, h, s.seq, DType::f32, true, masked, false);
        const double backward_bytes = attention_score_term_bytes(s.batch, h, s.seq, DType::f32, true, masked, true);
        MT_ASSIGN(const double forward_floor, streaming_floor_us(b, forward_bytes, t, sync, sharing));
        MT_ASSIGN(const double backward_floor, streaming_floor_us(b, backward_bytes, t, sync, sharing));
        score_terms.push_back({"attention_score_terms", forward_bytes,
                               std::max(forward_floor, scored.first.time_us - plain.first.time_us),
                               scored.first.spread});
        score_terms.push_back({"attention_score_terms", backward_bytes,
                               std::max(backward_floor, scored.second.time_us - plain.second.time_us),
                               scored.second.spread});
      }
    }
    if (progress) progress(i + 1);
  }
  return out;
}

namespace {

// A call of op `s.op` (a cost name) on fresh tensors of shape s: the op table's sample, and the bytes it
// moves as the table counts them for the simulator too, so that a lookup by the simulated bytes finds
// these entries.
Result<std::pair<std::function<void()>, double>> make_op(Backend& b, const OpShape& s) {
  for (const OpInfo* op : per_op_measured()) {
    if (op->cost_name != s.op) continue;
    MT_ASSIGN(OpSample sample, op->sample(b, SampleShape{s.rows, s.cols, s.dtype}));
    return std::make_pair(std::move(sample.run), sample.cost.bytes);
  }
  return make_error("calibrate: no measurement for op '{}'; the measured ops are {}", s.op,
                    fmt::join(measured_ops(), ", "));
}

}  // namespace

Result<std::vector<sim::Calibration::Op>> measure_ops(Backend& b, const std::vector<OpShape>& shapes,
                                                      const Timing& t, const Sync& sync,
                                                      int sharing, const Progress& progress) {
  std::vector<sim::Calibration::Op> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const OpShape& s = shapes[i];
    MT_ASSIGN(auto first, make_op(b, s));
    const double bytes = first.second;
    std::vector<std::function<void()>> calls = {std::move(first.first)};
    for (int k = 1; k < cold_sets(bytes, Residency::kBeyondL3, t); ++k) {
      MT_ASSIGN(auto more, make_op(b, s));
      calls.push_back(std::move(more.first));
    }
    std::function<void()> op = rotating(std::move(calls));
    MT_ASSIGN(auto r, time_op(b, op, t, sync, sharing));
    out.push_back({s.op, bytes, r.first, r.second});
    if (progress) progress(i + 1);
  }
  return out;
}

Result<std::vector<sim::Calibration::Collective>> measure_collectives(
    Backend& b, const Group& g, const std::vector<double>& sizes, const Timing& t,
    const std::string& transport, const Progress& progress) {
  using sim::CollectiveKind;
  const int n = g.size();
  const int me = g.index_of(b.rank());
  if (me < 0) return make_error("calibrate: rank {} is not in the measured group", b.rank());
  const CollectiveKind kinds[] = {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kAllGather, CollectiveKind::kBroadcast,
                                  CollectiveKind::kAllToAll, CollectiveKind::kSendRecv};
  std::vector<sim::Calibration::Collective> out;
  Tensor agree = b.empty(Shape{1});
  std::size_t done = 0;
  for (CollectiveKind kind : kinds) {
    for (double bytes : sizes) {
      // Elements of the nccl-tests size, a multiple of the group size.
      std::int64_t elems = std::max<std::int64_t>(n, static_cast<std::int64_t>(bytes / 4));
      elems -= elems % n;
      const std::int64_t block = elems / n;
      Tensor big = filled(b, Shape{elems}, 1.f), small = filled(b, Shape{block}, 1.f);
      Tensor exchanged = kind == CollectiveKind::kAllToAll ? filled(b, Shape{elems}, 0.f) : Tensor{};
      std::vector<std::int64_t> counts(static_cast<std::size_t>(n), block);
      const bool pair_member = me < 2;
      int tag = 0;
      std::function<void()> op;
      switch (kind) {
        case CollectiveKind::kAllReduce: op = [&] { b.all_reduce(big, g, ReduceOp::sum); }; break;
        case CollectiveKind::kReduceScatter:
          op = [&] { b.reduce_scatter(big, small, g, ReduceOp::sum); };
          break;
        case CollectiveKind::kAllGather: op = [&] { b.all_gather(small, big, g); }; break;
        case CollectiveKind::kBroadcast: op = [&] { b.broadcast(big, g, g.ranks[0]); }; break;
        case CollectiveKind::kAllToAll:
          op = [&] { b.all_to_all(big, counts, exchanged, counts, g); };
          break;
        case CollectiveKind::kSendRecv:
          // A round trip (0 sends, 1 receives and sends back) is two messages.
          op = [&] {
            if (pair_member) round_trip(b, big, g, me, ++tag);
          };
          break;
      }
      // Every member must run the same number of calls: a fixed pilot of 4
      // calls after one warm-up, and the slowest member's time decides.
      op();
      const auto p0 = Clock::now();
      for (int i = 0; i < 4; ++i) op();
      MT_TRY(b.synchronize());
      b.fill(agree, static_cast<float>(since(p0) / 4));
      b.all_reduce(agree, g, ReduceOp::max);
      std::vector<float> host(1);
      MT_TRY(b.read(agree, host));
      const int iters = static_cast<int>(
          std::clamp(std::ceil(t.min_sample_s / std::max(1e-9, static_cast<double>(host[0]))), 1.0,
                     1e5));
      MT_ASSIGN(std::vector<double> samples, samples_after_barriers(b, g, t.samples, iters, op));
      if (kind == CollectiveKind::kSendRecv)
        for (double& s : samples) s /= 2;  // one message of the round trip
      double median_us = 0;
      auto spread = spread_of(samples, 1, median_us, t.mean);
      const double real_bytes = static_cast<double>(elems) * 4;
      const int members = kind == CollectiveKind::kSendRecv ? 2 : n;
      const double busbw =
          real_bytes * sim::busbw_factor(kind, members) / (median_us * 1e-6) / 1e9;
      out.push_back({kind, members, real_bytes, busbw, transport, spread});
      if (progress) progress(++done);
    }
    if (kind == CollectiveKind::kSendRecv && n > 2) break;
  }
  return out;
}

Result<sim::Calibration::Link> measure_link(Backend& b, const Group& g, double bytes,
                                            const Timing& t) {
  const int me = g.index_of(b.rank());
  if (me < 0 || g.size() < 2) return make_error("calibrate: a link needs two members");
  auto one_way = [&](std::int64_t elems) -> Result<double> {
    Tensor x = filled(b, Shape{elems}, 1.f);
    int tag = 1 << 20;
    auto op = [&] {
      if (me < 2) round_trip(b, x, g, me, ++tag);
    };
    const int iters = 64;
    op();
    MT_ASSIGN(std::vector<double> samples, samples_after_barriers(b, g, t.samples, iters, op));
    for (double& s : samples) s /= 2;  // one message of the round trip
    double median_us = 0;
    spread_of(samples, 1, median_us);
    return median_us;
  };
  MT_ASSIGN(double latency_us, one_way(1));
  const auto elems = static_cast<std::int64_t>(bytes / 4);
  MT_ASSIGN(double big_us, one_way(elems));
  const double gbps = static_cast<double>(elems) * 4 / std::max(1e-3, big_us - latency_us) / 1e3;
  return sim::Calibration::Link{"nvlink", gbps, latency_us};
}

}  // namespace meshtrain::calibrate
