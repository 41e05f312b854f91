// Reductions give identical bits with one TBB thread and with two, and run
// after run.
#include <oneapi/tbb/global_control.h>

#include <cstring>

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
}  // namespace meshtrain
