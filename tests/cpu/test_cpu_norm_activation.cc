// LayerNorm, RMSNorm, GELU, SwiGLU and dropout: fp64 backward against finite
// differences of the fp64 forward, then the fp32 backend against fp64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <tuple>

#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/fast_math.h"
#include "backends/cpu/kernels/norm.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using namespace testing;  // cpu_test_util.h

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

TEST_CASE("cpu layernorm backward", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("layernorm"));
  const std::int64_t N = 5, C = 8;
  const double eps = 1e-5;
  Vec x = testing::random_vec(rng, N * C, 2.0), w = testing::random_vec(rng, C);
  Vec b = testing::random_vec(rng, C);
  const Vec dout = testing::random_vec(rng, N * C);
  auto forward = [&] {
    Vec out(x.size()), mean(N), rstd(N);
    cpu::layernorm_forward<double>(N, C, x.data(), w.data(), b.data(), out.data(), mean.data(),
                                   rstd.data(), eps);
    return std::tuple{out, mean, rstd};
  };
  auto [out, mean, rstd] = forward();
  // Each row is normalised: out = w · (x - mean)/σ + b.
  for (std::int64_t j = 0; j < C; ++j) {
    double mu = 0, var = 0;
    for (std::int64_t k = 0; k < C; ++k) mu += x[k] / C;
    for (std::int64_t k = 0; k < C; ++k) var += (x[k] - mu) * (x[k] - mu) / C;
    REQUIRE(out[j] == Approx(w[j] * (x[j] - mu) / std::sqrt(var + eps) + b[j]).epsilon(1e-12));
  }
  const Vec dw0 = testing::random_vec(rng, C), db0 = testing::random_vec(rng, C);
  Vec dx(x.size()), dw = dw0, db = db0;
  cpu::layernorm_backward<double>(N, C, dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                  dx.data(), dw.data(), db.data());
  const auto loss = [&] { return testing::dot(dout, std::get<0>(forward())); };
  CHECK(rel_err(dx, numeric_grad(x, loss)) < kFdTol);
  CHECK(rel_err(minus(dw, dw0), numeric_grad(w, loss)) < kFdTol);
  CHECK(rel_err(minus(db, db0), numeric_grad(b, loss)) < kFdTol);

  CpuBackend be;
  Tensor tx = upload(be, {N, C}, x), tw = upload(be, {C}, w), tb = upload(be, {C}, b);
  Tensor to = be.empty({N, C}), tm = be.empty({N}), tr = be.empty({N});
  be.layernorm_forward(tx, tw, tb, to, tm, tr, static_cast<float>(eps));
  CHECK(rel_err(download(be, to), out) < 1e-5);
  Tensor tdx = be.empty({N, C}), tdw = upload(be, {C}, dw0), tdb = upload(be, {C}, db0);
  be.layernorm_backward(upload(be, {N, C}, dout), tx, tw, tm, tr, tdx, tdw, tdb);
  CHECK(rel_err(download(be, tdx), dx) < kF32Tol);
  CHECK(rel_err(download(be, tdw), dw) < kF32Tol);
  CHECK(rel_err(download(be, tdb), db) < kF32Tol);
}

TEST_CASE("cpu rmsnorm backward", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("rmsnorm"));
  const std::int64_t N = 4, C = 6;
  const double eps = 1e-6;
  Vec x = testing::random_vec(rng, N * C), w = testing::random_vec(rng, C);
  const Vec dout = testing::random_vec(rng, N * C);
  auto forward = [&] {
    Vec out(x.size()), rstd(N);
    cpu::rmsnorm_forward<double>(N, C, x.data(), w.data(), out.data(), rstd.data(), eps);
    return std::pair{out, rstd};
  };
  auto [out, rstd] = forward();
  double ms = 0;
  for (std::int64_t k = 0; k < C; ++k) ms += x[k] * x[k] / C;
  REQUIRE(out[1] == Approx(x[1] * w[1] / std::sqrt(ms + eps)).epsilon(1e-12));
  const Vec dw0 = testing::random_vec(rng, C);
  Vec dx(x.size()), dw = dw0;
  cpu::rmsnorm_backward<double>(N, C, dout.data(), x.data(), w.data(), rstd.data(), dx.data(),
                                dw.data());
  const auto loss = [&] { return testing::dot(dout, forward().first); };
  CHECK(rel_err(dx, numeric_grad(x, loss)) < kFdTol);
  CHECK(rel_err(minus(dw, dw0), numeric_grad(w, loss)) < kFdTol);

  CpuBackend be;
  Tensor tx = upload(be, {N, C}, x), tw = upload(be, {C}, w);
  Tensor to = be.empty({N, C}), tr = be.empty({N});
  be.rmsnorm_forward(tx, tw, to, tr, static_cast<float>(eps));
  CHECK(rel_err(download(be, to), out) < 1e-5);
  Tensor tdx = be.empty({N, C}), tdw = upload(be, {C}, dw0);
  be.rmsnorm_backward(upload(be, {N, C}, dout), tx, tw, tr, tdx, tdw);
  CHECK(rel_err(download(be, tdx), dx) < kF32Tol);
  CHECK(rel_err(download(be, tdw), dw) < kF32Tol);
}

TEST_CASE("cpu gelu backward", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("gelu"));
  const std::int64_t n = 50;
  Vec x = testing::random_vec(rng, n, 2.0);
  const Vec dout = testing::random_vec(rng, n);
  auto forward = [&] {
    Vec out(x.size());
    cpu::gelu_forward<double>(n, x.data(), out.data());
    return out;
  };
  const Vec out = forward();
  const double v = x[3];
  REQUIRE(out[3] ==
          Approx(0.5 * v *
                 (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)))));
  Vec dx(x.size());
  cpu::gelu_backward<double>(n, dout.data(), x.data(), dx.data());
  CHECK(rel_err(dx, numeric_grad(x, [&] { return testing::dot(dout, forward()); })) < kFdTol);
  CpuBackend be;
  Tensor tx = upload(be, {n}, x), to = be.empty({n}), tdx = be.empty({n});
  be.gelu_forward(tx, to);
  be.gelu_backward(upload(be, {n}, dout), tx, tdx);
  CHECK(rel_err(download(be, to), out) < 1e-6);
  CHECK(rel_err(download(be, tdx), dx) < kF32Tol);
}

TEST_CASE("cpu fp32 tanh approximation against tanh in fp64", "[cpu]") {
  double worst = 0;
  for (int i = -400000; i <= 400000; ++i) {  // [-20, 20] in steps of 5e-5
    const float x = static_cast<float>(i * 5e-5);
    const double ref = std::tanh(static_cast<double>(x));
    const double err = std::abs(cpu::tanh_approx(x) - ref) / std::max(std::abs(ref), 1e-30);
    worst = std::max(worst, err);
  }
  CHECK(worst < 5e-7);
  CHECK(cpu::tanh_approx(1e-30f) == 1e-30f);
  CHECK(cpu::tanh_approx(-3.0f) == -cpu::tanh_approx(3.0f));
  CHECK(cpu::tanh_approx(std::numeric_limits<float>::infinity()) == Approx(1.0).epsilon(1e-7));
  CHECK(cpu::tanh_approx(-std::numeric_limits<float>::infinity()) == Approx(-1.0).epsilon(1e-7));
  CHECK(std::isnan(cpu::tanh_approx(std::numeric_limits<float>::quiet_NaN())));  // a NaN loss must stay NaN
}

TEST_CASE("cpu fp32 exp approximation against exp in fp64", "[cpu]") {
  double worst = 0;
  for (int i = -870000; i <= 880000; ++i) {  // [-87, 88] in steps of 1e-4
    const float x = static_cast<float>(i * 1e-4);
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(cpu::exp_approx(x) - ref) / ref);
  }
  CHECK(worst < 2e-7);
  CHECK(cpu::exp_approx(0.0f) == 1.0f);
  CHECK(cpu::exp_approx(-100.0f) == 0.0f);  // no subnormals
  CHECK(cpu::exp_approx(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(cpu::exp_approx(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("cpu swiglu backward", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("swiglu"));
  const std::int64_t N = 3, F = 5;
  Vec x = testing::random_vec(rng, N * 2 * F);
  const Vec dout = testing::random_vec(rng, N * F);
  auto forward = [&] {
    Vec out(static_cast<std::size_t>(N * F));
    cpu::swiglu_forward<double>(N, F, x.data(), out.data());
    return out;
  };
  const Vec out = forward();
  const double g = x[2 * F + 1], u = x[2 * F + F + 1];  // row 1, column 1
  REQUIRE(out[F + 1] == Approx(g / (1 + std::exp(-g)) * u).epsilon(1e-12));
  Vec dx(x.size());
  cpu::swiglu_backward<double>(N, F, dout.data(), x.data(), dx.data());
  CHECK(rel_err(dx, numeric_grad(x, [&] { return testing::dot(dout, forward()); })) < kFdTol);
  CpuBackend be;
  Tensor tx = upload(be, {N, 2 * F}, x), to = be.empty({N, F}), tdx = be.empty({N, 2 * F});
  be.swiglu_forward(tx, to);
  be.swiglu_backward(upload(be, {N, F}, dout), tx, tdx);
  CHECK(rel_err(download(be, to), out) < 1e-6);
  CHECK(rel_err(download(be, tdx), dx) < kF32Tol);
}

TEST_CASE("cpu dropout: counter-based mask, shards, backward", "[cpu]") {
  const std::uint64_t seed = testing::seed_for("dropout");
  std::mt19937_64 rng(seed);
  const std::int64_t n = 100000;
  const Vec x = testing::random_vec(rng, n);
  CpuBackend be;
  const DropoutOp op{0.3f, seed, 1000};
  Tensor tx = upload(be, {n}, x), out = be.empty({n});
  be.dropout_forward(tx, out, op);
  const Vec full = download(be, out);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (full[i] != 0) {
      ++kept;
      REQUIRE(full[i] == Approx(static_cast<float>(x[i]) / 0.7f).epsilon(1e-6));
    }
  }
  CHECK(static_cast<double>(kept) / n == Approx(0.7).margin(0.01));
  // A shard starting at element 12345 with offset + 12345 draws the same mask.
  const std::int64_t begin = 12345, count = 777;
  Tensor shard_out = be.empty({count});
  be.dropout_forward(tx.slice(begin, count), shard_out,
                     DropoutOp{op.p, op.seed, op.offset + static_cast<std::uint64_t>(begin)});
  CHECK(download(be, shard_out) == Vec(full.begin() + begin, full.begin() + begin + count));
  // Backward drops the same elements and scales the same way.
  const Vec dout = testing::random_vec(rng, n);
  Tensor dx = be.empty({n});
  be.dropout_backward(upload(be, {n}, dout), dx, op);
  const Vec got = download(be, dx);
  for (std::int64_t i = 0; i < n; ++i) {
    if (full[i] == 0)
      REQUIRE(got[i] == 0);
    else
      REQUIRE(got[i] == Approx(static_cast<float>(dout[i]) / 0.7f).epsilon(1e-6));
  }
  // Another seed draws another mask; p = 0 keeps everything unchanged.
  Tensor other = be.empty({n});
  be.dropout_forward(tx, other, DropoutOp{op.p, seed + 1, op.offset});
  CHECK(download(be, other) != full);
  be.dropout_forward(tx, other, DropoutOp{0.f, seed, 0});
  CHECK(download(be, other) == download(be, tx));
}

}  // namespace
}  // namespace meshtrain
