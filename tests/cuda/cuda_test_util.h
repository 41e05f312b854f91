// Shared by the gpu tests: a cuda backend or a loud skip, deterministic
// inputs, host round trips, and the normwise comparison against the cpu
// reference.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <concepts>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/half.h"

namespace meshtrain::cuda::testing {

using Vec = std::vector<float>;

inline std::unique_ptr<CudaBackend> make_gpu() {
  if (device_count() == 0) return nullptr;
  auto b = CudaBackend::create();
  REQUIRE(b.ok());  // a device exists: failing to use it is a failure, not a skip
  return std::move(b).value();
}

// Declares `CudaBackend& name`, or returns from the test saying loudly that
// nothing was checked (experiments/gpu/check.sh counts these lines).
#define MT_GPU_OR_SKIP(name)                                                           \
  auto name##_owner = ::meshtrain::cuda::testing::make_gpu();                          \
  if (!name##_owner) {                                                                 \
    WARN("SKIPPED: no CUDA device (cudaGetDeviceCount found none); nothing checked"); \
    std::puts("SKIPPED: no CUDA device");                                              \
    return;                                                                            \
  }                                                                                    \
  ::meshtrain::cuda::CudaBackend& name = *name##_owner

inline Vec random(std::size_t n, std::uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// AdamW's second moment: squares of normal(0, 0.1) values, all >= 0.
inline Vec random_second_moment(std::size_t n, std::uint64_t seed) {
  Vec v = random(n, seed, 0.1f);
  for (float& x : v) x = x * x;
  return v;
}

// n token ids, each next(rng) of one mt19937 seeded with seed.
template <std::invocable<std::mt19937&> Next>
std::vector<std::int32_t> random_ids(std::int64_t n, std::uint32_t seed, Next&& next) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& i : ids) i = static_cast<std::int32_t>(next(rng));
  return ids;
}
// n token ids uniform in [0, below).
inline std::vector<std::int32_t> random_ids(std::int64_t n, std::uint32_t seed, std::uint32_t below) {
  return random_ids(n, seed, [below](std::mt19937& rng) { return rng() % below; });
}

// n cross-entropy targets, i·37 mod 1500: spread over a 1500-token
// vocabulary, so that a shard of it holds some and not others.
inline std::vector<std::int32_t> cross_entropy_targets(std::int64_t n) {
  std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37) % 1500);
  return targets;
}

inline Tensor up(Backend& b, Shape s, const Vec& v, DType d = DType::f32) {
  Tensor t = b.empty(s, d);
  b.write(t, v);
  return t;
}
inline Tensor up_ids(Backend& b, Shape s, const std::vector<std::int32_t>& v) {
  Tensor t = b.empty(s, DType::i32);
  b.write(t, v);
  return t;
}
inline Vec down(Backend& b, const Tensor& t) {
  Vec v(static_cast<std::size_t>(t.numel()));
  REQUIRE(b.read(t, v).ok());
  return v;
}
// The values of several tensors, one after another.
inline Vec down_all(Backend& b, std::initializer_list<const Tensor*> ts) {
  Vec out;
  for (const Tensor* t : ts) {
    const Vec v = down(b, *t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The vocab-parallel cross-entropy phases as the engine runs them, over
// logits (N, V) whose shard starts at vocabulary id offset: the row maxima,
// the partial sums and target logits, the losses, and the backward (scale
// 0.25) into dlogits of the logits' dtype.
struct CrossEntropyRun {
  Tensor max, sums, target_logits, loss, dlogits;
};
inline CrossEntropyRun cross_entropy_phases(Backend& b, const Tensor& logits, const Tensor& targets, std::int64_t N,
                                            std::int64_t V, std::int64_t offset) {
  CrossEntropyRun r{b.empty({N}), b.empty({N}), b.empty({N}), b.empty({N}), b.empty({N, V}, logits.dtype())};
  b.cross_entropy_max(logits, r.max);
  b.cross_entropy_partials(logits, targets, r.max, offset, r.sums, r.target_logits);
  b.cross_entropy_loss(r.max, r.sums, r.target_logits, r.loss);
  b.cross_entropy_backward(logits, targets, r.max, r.sums, offset, 0.25f, r.dlogits);
  return r;
}

// ||got - want|| / ||want||; returns it after checking it against tol.
inline double expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double d = 0, n = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    n += double(want[i]) * want[i];
  }
  const double err = std::sqrt(d) / (n > 0 ? std::sqrt(n) : 1.0);
  INFO(what << ": relative error " << err << " (tolerance " << tol << ")");
  CHECK(err <= tol);
  return err;
}

// run(gpu) against run(cpu) (expect_close), and a second run(gpu) the same
// bits as the first: a deterministic kernel.
template <class Run>
void expect_close_and_repeatable(Backend& gpu, Backend& cpu, Run&& run, double tol, const std::string& what) {
  const Vec g = run(gpu);
  expect_close(g, run(cpu), tol, what);
  CHECK(run(gpu) == g);
}

// v as stored in dtype d and read back (what a 16-bit tensor holds).
inline Vec round_to(Vec v, DType d) {
  for (auto& x : v) {
    if (d == DType::bf16) x = bf16_to_float(float_to_bf16(x));
    if (d == DType::f16) x = f16_to_float(float_to_f16(x));
  }
  return v;
}
inline Vec bf16_round(Vec v) { return round_to(std::move(v), DType::bf16); }

constexpr double kF32 = 1e-5;

// Attention of H query heads, G kv heads of dimension D, scale 1/sqrt(D), no
// bias or mask (set field by field: the op has more members than a test sets).
inline AttentionOp attention_op(std::int64_t H, std::int64_t G, std::int64_t D) {
  AttentionOp op;
  op.heads = static_cast<int>(H);
  op.kv_heads = static_cast<int>(G);
  op.head_dim = static_cast<int>(D);
  op.scale = 1.f / std::sqrt(static_cast<float>(D));
  return op;
}

}  // namespace meshtrain::cuda::testing
