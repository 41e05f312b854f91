// Vocab-parallel cross-entropy, the clip coefficient and AdamW.
#include "backends/cpu/kernels/cross_entropy.h"
#include "backends/cpu/kernels/optimizer.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using namespace testing;  // cpu_test_util.h

// losses (N) of one unsharded shard, phases back to back.
Vec ce_losses(std::int64_t N, std::int64_t V, const Vec& logits,
              const std::vector<std::int32_t>& t) {
  Vec mx(N), se(N), tl(N), loss(N);
  cpu::cross_entropy_max<double>(N, V, logits.data(), mx.data());
  cpu::cross_entropy_partials<double>(N, V, logits.data(), t.data(), mx.data(), 0, se.data(),
                                      tl.data());
  cpu::cross_entropy_loss<double>(N, mx.data(), se.data(), tl.data(), loss.data());
  return loss;
}

TEST_CASE("cpu cross-entropy: loss, backward, and a 2-shard vocabulary", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("cross_entropy"));
  const std::int64_t N = 5, V = 8, half = 4;
  const std::vector<std::int32_t> targets{0, 7, 3, 4, 5};
  Vec logits = testing::random_vec(rng, N * V, 3.0);
  const Vec loss = ce_losses(N, V, logits, targets);
  for (std::int64_t r = 0; r < N; ++r) {
    double z = 0;
    for (std::int64_t j = 0; j < V; ++j) z += std::exp(logits[r * V + j]);
    REQUIRE(loss[r] == Approx(std::log(z) - logits[r * V + targets[r]]).epsilon(1e-12));
  }
  const double dloss = 0.2;  // the mean over N rows
  Vec mx(N), se(N), tl(N), dlogits(logits.size());
  cpu::cross_entropy_max<double>(N, V, logits.data(), mx.data());
  cpu::cross_entropy_partials<double>(N, V, logits.data(), targets.data(), mx.data(), 0, se.data(),
                                      tl.data());
  cpu::cross_entropy_backward<double>(N, V, logits.data(), targets.data(), mx.data(), se.data(), 0,
                                      dloss, dlogits.data());
  const Vec fd = testing::numeric_grad(logits, [&] {
    double s = 0;
    for (double l : ce_losses(N, V, logits, targets)) s += dloss * l;
    return s;
  });
  CHECK(rel_err(dlogits, fd) < kFdTol);

  CpuBackend be;
  Tensor tt = testing::upload_ids(be, targets);
  Tensor full = upload(be, {N, V}, logits);
  Tensor fmax = be.empty({N}), fse = be.empty({N}), ftl = be.empty({N}), floss = be.empty({N});
  be.cross_entropy_max(full, fmax);
  be.cross_entropy_partials(full, tt, fmax, 0, fse, ftl);
  be.cross_entropy_loss(fmax, fse, ftl, floss);
  CHECK(rel_err(download(be, floss), loss) < 1e-5);
  Tensor fd32 = be.empty({N, V});
  be.cross_entropy_backward(full, tt, fmax, fse, 0, static_cast<float>(dloss), fd32);
  CHECK(rel_err(download(be, fd32), dlogits) < kF32Tol);

  // Two shards of 4 columns, row statistics combined by hand as the caller
  // would with all-reduce max, then sum.
  std::vector<Tensor> shard(2), smax(2), sse(2), stl(2);
  Vec gmax(N, -1e30), gse(N, 0), gtl(N, 0);
  for (int s = 0; s < 2; ++s) {
    Vec cols(static_cast<std::size_t>(N * half));
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t j = 0; j < half; ++j) cols[r * half + j] = logits[r * V + s * half + j];
    shard[s] = upload(be, {N, half}, cols);
    smax[s] = be.empty({N});
    be.cross_entropy_max(shard[s], smax[s]);
    const Vec m = download(be, smax[s]);
    for (std::int64_t r = 0; r < N; ++r) gmax[r] = std::max(gmax[r], m[r]);
  }
  Tensor tgmax = upload(be, {N}, gmax);
  for (int s = 0; s < 2; ++s) {
    sse[s] = be.empty({N});
    stl[s] = be.empty({N});
    be.cross_entropy_partials(shard[s], tt, tgmax, s * half, sse[s], stl[s]);
    const Vec e = download(be, sse[s]), t = download(be, stl[s]);
    for (std::int64_t r = 0; r < N; ++r) {
      gse[r] += e[r];
      gtl[r] += t[r];
    }
  }
  Tensor tgse = upload(be, {N}, gse), sloss = be.empty({N});
  be.cross_entropy_loss(tgmax, tgse, upload(be, {N}, gtl), sloss);
  CHECK(rel_err(download(be, sloss), download(be, floss)) < 1e-6);
  const Vec full_d = download(be, fd32);
  for (int s = 0; s < 2; ++s) {
    Tensor sd = be.empty({N, half});
    be.cross_entropy_backward(shard[s], tt, tgmax, tgse, s * half, static_cast<float>(dloss), sd);
    const Vec got = download(be, sd);
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t j = 0; j < half; ++j)
        REQUIRE(got[r * half + j] == Approx(full_d[r * V + s * half + j]).margin(1e-6));
  }
}

TEST_CASE("cpu clip_coefficient", "[cpu]") {
  CpuBackend be;
  Tensor coef = be.empty({1});
  be.clip_coefficient(upload(be, {1}, {16}), 2.f, coef);
  CHECK(download(be, coef)[0] == Approx(2 / (4 + 1e-6)).epsilon(1e-7));
  be.clip_coefficient(upload(be, {1}, {16}), 10.f, coef);
  CHECK(download(be, coef)[0] == 1.0);
  CHECK(cpu::clip_coefficient<double>(0.0, 1.0) == 1.0);
}

// Parameters, gradients and moments of n elements drawn from rng in that
// order, the second moments squared (a variance is not negative).
struct AdamWInputs {
  Vec p, g, m, v;
};
AdamWInputs random_adamw_inputs(std::mt19937_64& rng, std::int64_t n) {
  AdamWInputs in;
  in.p = testing::random_vec(rng, n);
  in.g = testing::random_vec(rng, n);
  in.m = testing::random_vec(rng, n, 0.1);
  in.v = testing::random_vec(rng, n, 0.1);
  for (double& x : in.v) x = x * x;
  return in;
}

TEST_CASE("cpu adamw: one step against a hand-written reference", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("adamw"));
  const std::int64_t n = 1000;
  const auto [p0, g, m0, v0] = random_adamw_inputs(rng, n);
  const AdamWOp op{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
  const double coef = 0.5;
  CpuBackend be;
  for (bool clipped : {false, true}) {
    INFO("clipped " << clipped);
    Tensor tp = upload(be, {n}, p0), tm = upload(be, {n}, m0), tv = upload(be, {n}, v0);
    const Tensor tc = clipped ? upload(be, {1}, {coef}) : Tensor();
    be.adamw(tp, upload(be, {n}, g), tm, tv, tc, op);
    Vec want_p(n), want_m(n), want_v(n);
    const double b1 = op.beta1, b2 = op.beta2, lr = op.lr, wd = op.weight_decay;
    for (std::int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * (clipped ? coef : 1.0);
      want_m[i] = b1 * m0[i] + (1 - b1) * gi;
      want_v[i] = b2 * v0[i] + (1 - b2) * gi * gi;
      const double mhat = want_m[i] / (1 - std::pow(b1, 3)),
                   vhat = want_v[i] / (1 - std::pow(b2, 3));
      want_p[i] = p0[i] - lr * wd * p0[i] - lr * mhat / (std::sqrt(vhat) + op.eps);
    }
    CHECK(rel_err(download(be, tm), want_m) < 1e-6);
    CHECK(rel_err(download(be, tv), want_v) < 1e-6);
    Vec step(n), want_step(n);  // compare the update itself, not just the parameter
    const Vec got_p = download(be, tp);
    for (std::int64_t i = 0; i < n; ++i) {
      step[i] = got_p[i] - static_cast<float>(p0[i]);
      want_step[i] = want_p[i] - p0[i];
    }
    CHECK(rel_err(step, want_step) < 1e-4);
  }
}

}  // namespace
TEST_CASE("cpu adamw with a frozen variance (1-bit Adam): v keeps its bits, corrected as at its step", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("adamw frozen variance"));
  const std::int64_t n = 1000;
  const auto [p0, g, m0, v0] = random_adamw_inputs(rng, n);
  AdamWOp op{1e-2f, 0.9f, 0.95f, 1e-8f, 0.f, 40};
  op.variance_frozen_at = 7;
  CpuBackend be;
  Tensor tp = upload(be, {n}, p0), tm = upload(be, {n}, m0), tv = upload(be, {n}, v0);
  const std::vector<float> v_before = testing::download_f32(be, tv);
  be.adamw(tp, upload(be, {n}, g), tm, tv, Tensor(), op);
  CHECK(testing::download_f32(be, tv) == v_before);
  Vec want_step(n), step(n);
  const Vec got_p = download(be, tp);
  for (std::int64_t i = 0; i < n; ++i) {
    const double m = op.beta1 * m0[i] + (1 - op.beta1) * g[i];
    const double mhat = m / (1 - std::pow(op.beta1, 40)), vhat = v_before[i] / (1 - std::pow(op.beta2, 7));
    want_step[i] = -op.lr * mhat / (std::sqrt(vhat) + op.eps);
    step[i] = got_p[i] - static_cast<float>(p0[i]);
  }
  CHECK(rel_err(step, want_step) < 1e-4);
}

}  // namespace meshtrain
