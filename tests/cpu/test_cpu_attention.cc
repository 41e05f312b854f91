// RoPE and grouped-query attention: causal, and bidirectional with a bias and a window mask.
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/rope.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using namespace testing;  // cpu_test_util.h

TEST_CASE("cpu rope: angles, inverse, backward", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("rope"));
  const std::int64_t B = 2, T = 3, Ht = 3, Hr = 2, D = 4;
  const double theta = 10000;
  Vec x = testing::random_vec(rng, B * T * Ht * D);
  auto rotate = [&](Vec v, bool inverse) {
    cpu::rope<double>(B, T, Ht, Hr, D, theta, inverse, 0, v.data());
    return v;
  };
  const Vec y = rotate(x, false);
  // Batch 1, token 2, head 1, pair 1 turns by 2 · theta^(-2/4).
  const std::int64_t at = ((1 * T + 2) * Ht + 1) * D + 2;
  const double a = 2 * std::pow(theta, -0.5);
  CHECK(y[at] == Approx(x[at] * std::cos(a) - x[at + 1] * std::sin(a)).epsilon(1e-14));
  CHECK(y[at + 1] == Approx(x[at] * std::sin(a) + x[at + 1] * std::cos(a)).epsilon(1e-14));
  // Token 0 and the heads beyond rotate_heads are untouched.
  for (std::int64_t row = 0; row < B * T; ++row)
    for (std::int64_t h = 0; h < Ht; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t i = (row * Ht + h) * D + d;
        if (h >= Hr || row % T == 0) REQUIRE(y[i] == x[i]);
      }
  CHECK(rel_err(rotate(y, true), x) < 1e-15);
  // The backward of a rotation is the inverse rotation of the gradient.
  const Vec w = testing::random_vec(rng, x.size());
  const Vec fd = testing::numeric_grad(x, [&] { return testing::dot(w, rotate(x, false)); });
  CHECK(rel_err(rotate(w, true), fd) < kFdTol);

  CpuBackend be;
  Tensor tx = upload(be, {B, T, Ht, D}, x);
  be.rope(tx, Ht, Hr, static_cast<float>(theta), false, 0);
  CHECK(rel_err(download(be, tx), y) < 1e-6);
  be.rope(tx, Ht, Hr, static_cast<float>(theta), true, 0);
  CHECK(rel_err(download(be, tx), x) < 1e-6);
  // A chunk of the sequence (context parallelism) from its first token's position: tokens 1..2 of
  // each sequence rotated alone, starting at position 1, give the whole rotation's bits.
  for (std::int64_t b = 0; b < B; ++b) {
    const auto first = x.begin() + (b * T + 1) * Ht * D, last = x.begin() + (b * T + T) * Ht * D;
    Vec chunk(first, last);
    cpu::rope<double>(1, T - 1, Ht, Hr, D, theta, false, 1, chunk.data());
    for (std::size_t i = 0; i < chunk.size(); ++i)
      REQUIRE(chunk[i] == y[static_cast<std::size_t>((b * T + 1) * Ht * D) + i]);
  }
}

struct AttentionCase {
  std::int64_t B, T, H, G, D;
};

// Softmax attention written out loop by loop, straight from backend.h.
void naive_attention(const AttentionCase& c, double scale, const Vec& qkv, Vec& out, Vec& lse) {
  const std::int64_t W = (c.H + 2 * c.G) * c.D;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const std::int64_t g = h / (c.H / c.G);
      for (std::int64_t t = 0; t < c.T; ++t) {
        Vec s(static_cast<std::size_t>(t + 1));
        double m = -1e300;
        for (std::int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (std::int64_t k = 0; k < c.D; ++k)
            d +=
                qkv[(b * c.T + t) * W + h * c.D + k] * qkv[(b * c.T + j) * W + (c.H + g) * c.D + k];
          s[j] = scale * d;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double v : s) z += std::exp(v - m);
        lse[(b * c.H + h) * c.T + t] = m + std::log(z);
        for (std::int64_t k = 0; k < c.D; ++k) {
          double o = 0;
          for (std::int64_t j = 0; j <= t; ++j)
            o += std::exp(s[j] - m) / z * qkv[(b * c.T + j) * W + (c.H + c.G + g) * c.D + k];
          out[((b * c.T + t) * c.H + h) * c.D + k] = o;
        }
      }
    }
}

TEST_CASE("cpu attention forward and backward, grouped-query and full", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("attention"));
  for (const AttentionCase c :
       {AttentionCase{2, 5, 4, 2, 4}, AttentionCase{1, 6, 2, 2, 3}, AttentionCase{2, 4, 4, 1, 2}}) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " G " << c.G << " D " << c.D);
    const cpu::AttentionDims d{c.B, c.T, c.H, c.G, c.D};
    const double scale = 1 / std::sqrt(static_cast<double>(c.D));
    const std::int64_t nq = c.B * c.T * (c.H + 2 * c.G) * c.D, no = c.B * c.T * c.H * c.D;
    const std::int64_t nl = c.B * c.H * c.T;
    Vec qkv = testing::random_vec(rng, nq);
    auto forward = [&] {
      Vec out(static_cast<std::size_t>(no)), lse(static_cast<std::size_t>(nl));
      cpu::attention_forward<double>(d, scale, qkv.data(), out.data(), lse.data());
      return std::pair{out, lse};
    };
    const auto [out, lse] = forward();
    Vec want_out(out.size()), want_lse(lse.size());
    naive_attention(c, scale, qkv, want_out, want_lse);
    CHECK(rel_err(out, want_out) < 1e-13);
    CHECK(rel_err(lse, want_lse) < 1e-13);

    const Vec dout = testing::random_vec(rng, no);
    Vec dqkv(qkv.size(), std::nan(""));  // overwritten, every element
    cpu::attention_backward<double>(d, scale, dout.data(), qkv.data(), out.data(), lse.data(),
                                    dqkv.data());
    const Vec fd = testing::numeric_grad(qkv, [&] { return testing::dot(dout, forward().first); });
    CHECK(rel_err(dqkv, fd) < kFdTol);

    CpuBackend be;
    const AttentionOp op{static_cast<int>(c.H), static_cast<int>(c.G), static_cast<int>(c.D),
                         static_cast<float>(scale)};
    const BackendAttention got = backend_attention(be, op, c.B, c.T, qkv, dout, /*poison_dqkv=*/true);
    CHECK(rel_err(got.out, out) < 1e-5);
    CHECK(rel_err(got.lse, lse) < 1e-5);
    CHECK(rel_err(got.dqkv, dqkv) < kF32Tol);
  }
}

// Bidirectional attention with score terms, written out: s = scale·q·k +
// bias[i][j][h] + mask[b mod W][i][j] over every key, bias (T, T, H), mask (W, T, T).
Vec naive_scored_attention(const AttentionCase& c, double scale, const Vec& qkv, const Vec& bias, const Vec& mask,
                           std::int64_t windows) {
  const std::int64_t W = (c.H + 2 * c.G) * c.D;
  Vec out(static_cast<std::size_t>(c.B * c.T * c.H * c.D));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const std::int64_t g = h / (c.H / c.G);
      for (std::int64_t t = 0; t < c.T; ++t) {
        Vec s(static_cast<std::size_t>(c.T));
        double m = -1e300;
        for (std::int64_t j = 0; j < c.T; ++j) {
          double d = 0;
          for (std::int64_t k = 0; k < c.D; ++k)
            d += qkv[(b * c.T + t) * W + h * c.D + k] * qkv[(b * c.T + j) * W + (c.H + g) * c.D + k];
          s[j] = scale * d + bias[(t * c.T + j) * c.H + h] + mask[((b % windows) * c.T + t) * c.T + j];
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double v : s) z += std::exp(v - m);
        for (std::int64_t k = 0; k < c.D; ++k) {
          double o = 0;
          for (std::int64_t j = 0; j < c.T; ++j)
            o += std::exp(s[j] - m) / z * qkv[(b * c.T + j) * W + (c.H + c.G + g) * c.D + k];
          out[((b * c.T + t) * c.H + h) * c.D + k] = o;
        }
      }
    }
  return out;
}

TEST_CASE("cpu attention with a bias and a window mask, bidirectional, and its bias gradient", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("scored attention"));
  const AttentionCase c{4, 5, 4, 2, 3};
  const std::int64_t windows = 2;
  const cpu::AttentionDims d{c.B, c.T, c.H, c.G, c.D};
  const double scale = 1 / std::sqrt(static_cast<double>(c.D));
  const std::int64_t nq = c.B * c.T * (c.H + 2 * c.G) * c.D, no = c.B * c.T * c.H * c.D, TT = c.T * c.T;
  Vec qkv = testing::random_vec(rng, nq), bias = testing::random_vec(rng, TT * c.H);
  Vec mask(static_cast<std::size_t>(windows * TT), 0.0);
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (rng() % 3 == 0 && i % static_cast<std::size_t>(c.T + 1) != 0) mask[i] = -100;  // never the diagonal
  // The kernel reads the bias heads-first.
  auto terms_of = [&](const Vec& b, Vec& heads_first) {
    heads_first.assign(b.size(), 0);
    for (std::int64_t ij = 0; ij < TT; ++ij)
      for (std::int64_t h = 0; h < c.H; ++h) heads_first[static_cast<std::size_t>(h * TT + ij)] = b[ij * c.H + h];
    cpu::ScoreTerms<double> t;
    t.causal = false;
    t.bias = heads_first.data();
    t.mask = mask.data();
    t.windows = windows;
    return t;
  };
  Vec hf;
  auto forward = [&] {
    Vec out(static_cast<std::size_t>(no)), lse(static_cast<std::size_t>(c.B * c.H * c.T));
    cpu::attention_forward<double>(d, scale, qkv.data(), out.data(), lse.data(), terms_of(bias, hf));
    return std::pair{out, lse};
  };
  const auto [out, lse] = forward();
  CHECK(rel_err(out, naive_scored_attention(c, scale, qkv, bias, mask, windows)) < 1e-13);

  const Vec dout = testing::random_vec(rng, no);
  Vec dqkv(qkv.size()), dscores(static_cast<std::size_t>(c.B * c.H * TT));
  cpu::attention_backward<double>(d, scale, dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(),
                                  terms_of(bias, hf), dscores.data());
  CHECK(rel_err(dqkv, testing::numeric_grad(qkv, [&] { return testing::dot(dout, forward().first); })) < kFdTol);
  // dbias (T, T, H) = Σ over the batch of the score gradients.
  Vec dbias(bias.size(), 0.0);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t ij = 0; ij < TT; ++ij) dbias[ij * c.H + h] += dscores[(b * c.H + h) * TT + ij];
  CHECK(rel_err(dbias, testing::numeric_grad(bias, [&] { return testing::dot(dout, forward().first); })) < kFdTol);

  CpuBackend be;
  AttentionOp op{static_cast<int>(c.H), static_cast<int>(c.G), static_cast<int>(c.D), static_cast<float>(scale)};
  op.causal = false;
  op.bias = upload(be, {c.T, c.T, c.H}, bias);
  op.mask = upload(be, {windows, c.T, c.T}, mask);
  op.dbias = be.empty({c.T, c.T, c.H});
  const BackendAttention got = backend_attention(be, op, c.B, c.T, qkv, dout);
  CHECK(rel_err(got.out, out) < 1e-5);
  CHECK(rel_err(got.dqkv, dqkv) < kF32Tol);
  CHECK(rel_err(download(be, op.dbias), dbias) < kF32Tol);
}

TEST_CASE("cpu gather_rows: rows by index, zeros for negative indices", "[cpu]") {
  CpuBackend be;
  const Vec src = {1, 2, 3, 4, 5, 6};  // (3, 2)
  Tensor ts = upload(be, {3, 2}, src), out = be.empty({4, 2});
  Tensor idx = be.empty({4}, DType::i32);
  be.write(idx, std::vector<std::int32_t>{2, -1, 0, 2});
  be.gather_rows(ts, idx, out);
  CHECK(download(be, out) == Vec{5, 6, 0, 0, 1, 2, 5, 6});
  Tensor max = upload(be, {3}, Vec{1, 2, 3}), target = upload(be, {3}, Vec{1, 1, 3}), correct = be.empty({1});
  be.cross_entropy_accuracy(max, target, correct, false);
  be.cross_entropy_accuracy(max, target, correct, true);
  CHECK(download(be, correct) == Vec{4});
}

}  // namespace
}  // namespace meshtrain
