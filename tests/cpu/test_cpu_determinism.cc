// Reductions, GEMMs and the multi-tensor optimizer ops give identical bits
// with one thread and with several, run after run; the multi-tensor ops give
// the bits of the per-tensor ops they replace.
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/gemm.h"

#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using testing::upload;
using testing::Vec;

// Runs every reducing op on fixed inputs and returns all their outputs.
std::vector<float> reductions(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t N = 2048, C = 96, V = 50;  // many row chunks
  CpuBackend be;
  const Vec x = testing::random_vec(rng, N * C), dy = testing::random_vec(rng, N * C);
  const Vec w = testing::random_vec(rng, C), bias = testing::random_vec(rng, C);
  std::vector<std::int32_t> ids(N);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % V);
  Tensor tx = upload(be, {N, C}, x), tdy = upload(be, {N, C}, dy), tw = upload(be, {C}, w);
  Tensor tb = upload(be, {C}, bias);
  std::vector<float> all;
  auto keep = [&](const Tensor& t) {
    const std::vector<float> v = testing::download_f32(be, t);
    all.insert(all.end(), v.begin(), v.end());
  };
  Tensor s = be.empty({1});
  be.sum(tx, s, 1.f, false);
  keep(s);
  be.sum_squares(tx, s, false);
  keep(s);
  Tensor db = upload(be, {C}, bias);
  be.bias_backward(tdy, db);
  keep(db);
  Tensor out = be.empty({N, C}), mean = be.empty({N}), rstd = be.empty({N}), dx = be.empty({N, C});
  Tensor dw = upload(be, {C}, w), dbias = upload(be, {C}, bias);
  be.layernorm_forward(tx, tw, tb, out, mean, rstd, 1e-5f);
  be.layernorm_backward(tdy, tx, tw, mean, rstd, dx, dw, dbias);
  keep(dx);
  keep(dw);
  keep(dbias);
  be.rmsnorm_forward(tx, tw, out, rstd, 1e-5f);
  be.rmsnorm_backward(tdy, tx, tw, rstd, dx, dw);
  keep(dw);
  Tensor table = be.empty({V, C});
  be.fill(table, 0.5f);
  be.embedding_backward(tdy, testing::upload_ids(be, ids), table, 0);
  keep(table);
  // Attention over (B=4, T=32, H=4, G=2, D=12) = the same x, reshaped.
  const AttentionOp op{4, 2, 12, 0.25f};
  Tensor qkv = tx.slice(0, 4 * 32 * 8 * 12, {4, 32, 8, 12}), ao = be.empty({4, 32, 4, 12}),
         lse = be.empty({4, 4, 32});
  Tensor dq = be.empty(qkv.shape());
  be.attention_forward(qkv, ao, lse, op);
  be.attention_backward(tdy.slice(0, ao.numel(), ao.shape()), qkv, ao, lse, dq, op);
  keep(dq);
  return all;
}

TEST_CASE("cpu reductions are bitwise independent of the thread count", "[cpu]") {
  const std::uint64_t seed = testing::seed_for("determinism");
  std::vector<float> one, two, again;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    one = reductions(seed);
  }
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 2);
    two = reductions(seed);
    again = reductions(seed);
  }
  REQUIRE(one.size() == two.size());
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(two.data(), again.data(), two.size() * sizeof(float)) == 0);
}

}  // namespace

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// c = op(a) op(b) (+ beta c, + bias) for shapes whose tile grids differ, on `threads` threads.
std::vector<float> gemms(std::uint64_t seed, int threads) {
  std::mt19937_64 rng(seed);
  CpuBackend be(CpuBackendOptions{threads});
  struct Case {
    std::int64_t m, n, k;
    bool ta, tb, bias;
    float beta;
  };
  const Case cases[] = {{256, 2304, 96, false, false, true, 0.f},  // 10 tiles of 256 × 240, the last 144 wide
                        {200, 300, 256, false, true, false, 1.f},  // 2 tiles, the second narrower
                        {96, 192, 1024, true, false, false, 1.f},  // narrowed to 96 columns
                        {64, 64, 16, true, true, true, 0.5f},      // one tile
                        {1000, 40, 300, false, false, true, 0.f}};  // narrow: 4 row tiles
  std::vector<float> all;
  for (const Case& c : cases) {
    const Vec a = testing::random_vec(rng, static_cast<std::size_t>(c.m * c.k));
    const Vec b = testing::random_vec(rng, static_cast<std::size_t>(c.k * c.n));
    const Vec c0 = testing::random_vec(rng, static_cast<std::size_t>(c.m * c.n));
    const Vec bias = testing::random_vec(rng, static_cast<std::size_t>(c.n));
    Tensor ta = upload(be, c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, a);
    Tensor tb = upload(be, c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, b);
    Tensor tc = upload(be, {c.m, c.n}, c0);
    GemmOp op{c.ta, c.tb, 1.25f, c.beta, c.bias ? upload(be, {c.n}, bias) : Tensor{}};
    be.gemm(ta, tb, tc, op);
    const std::vector<float> v = testing::download_f32(be, tc);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Tensors of ragged sizes (one of several kGrain chunks), as a bucket holds them.
const std::int64_t kSizes[] = {64, 16384 * 4, 5, 16384 * 3 + 77, 768, 16384};

struct OptimizerState {
  std::vector<float> sumsq, params, m, v;
};

// The gradient norm and two AdamW steps over kSizes, per tensor or as one multi-tensor op.
OptimizerState optimizer(std::uint64_t seed, int threads, bool foreach) {
  std::mt19937_64 rng(seed);
  CpuBackend be(CpuBackendOptions{threads});
  std::vector<Tensor> p, g, m, v;
  for (std::int64_t n : kSizes) {
    p.push_back(upload(be, {n}, testing::random_vec(rng, static_cast<std::size_t>(n))));
    g.push_back(upload(be, {n}, testing::random_vec(rng, static_cast<std::size_t>(n), 1e-2)));
    m.push_back(be.zeros({n}));
    v.push_back(be.zeros({n}));
  }
  Tensor sumsq = upload(be, {1}, Vec{0.375}), coef = be.empty({1});
  if (foreach) {
    be.foreach_sum_squares(g, sumsq);
  } else {
    for (const Tensor& x : g) be.sum_squares(x, sumsq, true);
  }
  be.clip_coefficient(sumsq, 0.5f, coef);
  for (std::int64_t step = 1; step <= 2; ++step) {
    AdamWOp op{1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, step};
    std::vector<AdamWTensors> group;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float decay = i % 2 == 0 ? 0.1f : 0.f;
      if (foreach) {
        group.push_back({p[i], g[i], m[i], v[i], decay});
      } else {
        AdamWOp one = op;
        one.weight_decay = decay;
        be.adamw(p[i], g[i], m[i], v[i], coef, one);
      }
    }
    if (foreach) be.foreach_adamw(group, coef, op);
  }
  OptimizerState out;
  out.sumsq = testing::download_f32(be, sumsq);
  for (std::size_t i = 0; i < p.size(); ++i)
    for (auto [t, dst] : {std::pair{&p[i], &out.params}, {&m[i], &out.m}, {&v[i], &out.v}}) {
      const std::vector<float> x = testing::download_f32(be, *t);
      dst->insert(dst->end(), x.begin(), x.end());
    }
  return out;
}

}  // namespace

TEST_CASE("GEMM tiles give the same bits on 1, 2 and 3 threads", "[cpu][gemm]") {
  const std::uint64_t seed = testing::seed_for("gemm tiles");
  const std::vector<float> one = gemms(seed, 1);
  CHECK(same_bits(gemms(seed, 2), one));
  CHECK(same_bits(gemms(seed, 3), one));
}

TEST_CASE("GEMM tiles are a function of the shape", "[cpu][gemm]") {
  // The forward GEMMs of GPT-2 small at B=4, T=64: an even count of equal tiles, each >= 16 MFLOP.
  const cpu::GemmTiles qkv = cpu::gemm_tiles(256, 2304, 768);  // 9 of 256 columns would be odd
  CHECK((qkv.rows == 256 && qkv.cols == 240 && qkv.count() == 10));
  const cpu::GemmTiles out = cpu::gemm_tiles(256, 768, 768);  // 3 of 256 would be under 4
  CHECK((out.rows == 256 && out.cols == 192 && out.count() == 4));
  const cpu::GemmTiles small = cpu::gemm_tiles(512, 192, 64);  // 12.6 MFLOP (the tiny model's qkv): one call
  CHECK((small.count() == 1 && small.rows == 512 && small.cols == 192));
}

TEST_CASE("foreach_sum_squares and foreach_adamw give the per-tensor bits on any thread count",
          "[cpu][optimizer]") {
  const std::uint64_t seed = testing::seed_for("foreach optimizer");
  const OptimizerState per_tensor = optimizer(seed, 1, false);
  for (int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    const OptimizerState fused = optimizer(seed, threads, true);
    CHECK(same_bits(fused.sumsq, per_tensor.sumsq));
    CHECK(same_bits(fused.params, per_tensor.params));
    CHECK(same_bits(fused.m, per_tensor.m));
    CHECK(same_bits(fused.v, per_tensor.v));
  }
}

TEST_CASE("zeros() holds zeros", "[cpu]") {
  CpuBackend be;
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{3}, std::int64_t{1} << 22}) {
    Tensor z = be.zeros({n});
    const std::vector<float> v = testing::download_f32(be, z);
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.f; }));
  }
}

}  // namespace meshtrain
