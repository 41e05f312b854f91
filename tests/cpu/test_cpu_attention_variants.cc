// Sliding-window attention and attention sinks (gpt-oss), forward and
// backward, against attention written out loop by loop from backend.h and
// against finite differences.
#include "backends/cpu/kernels/attention.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using namespace testing;  // cpu_test_util.h

struct VariantCase {
  std::int64_t B, T, H, G, D;
  std::int64_t window;  // 0: none
  bool sinks;
};

// Causal attention: query t reads keys max(0, t - window + 1)..t, and head
// h's sink logit joins the denominator: p_j = e^{s_j} / (Σ_k e^{s_k} + e^{sink_h}).
void naive_variant(const VariantCase& c, double scale, const Vec& qkv, const Vec& sinks, Vec& out, Vec& lse) {
  const std::int64_t W = (c.H + 2 * c.G) * c.D;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const std::int64_t g = h / (c.H / c.G);
      for (std::int64_t t = 0; t < c.T; ++t) {
        const std::int64_t first = c.window > 0 ? std::max<std::int64_t>(0, t - c.window + 1) : 0;
        Vec s;
        for (std::int64_t j = first; j <= t; ++j) {
          double dot = 0;
          for (std::int64_t k = 0; k < c.D; ++k)
            dot += qkv[(b * c.T + t) * W + h * c.D + k] * qkv[(b * c.T + j) * W + (c.H + g) * c.D + k];
          s.push_back(scale * dot);
        }
        double z = 0;
        for (double v : s) z += std::exp(v);
        if (c.sinks) z += std::exp(sinks[h]);
        lse[(b * c.H + h) * c.T + t] = std::log(z);
        for (std::int64_t k = 0; k < c.D; ++k) {
          double o = 0;
          for (std::int64_t j = first; j <= t; ++j)
            o += std::exp(s[j - first]) / z * qkv[(b * c.T + j) * W + (c.H + c.G + g) * c.D + k];
          out[((b * c.T + t) * c.H + h) * c.D + k] = o;
        }
      }
    }
}

TEST_CASE("cpu attention with a sliding window and sinks matches the written-out softmax and finite differences",
          "[cpu][attention-variants]") {
  std::mt19937_64 rng(testing::seed_for("attention variants"));
  // Windows of one key (each token itself), shorter than T, and longer than T (no effect).
  for (const VariantCase c : {VariantCase{2, 7, 4, 2, 3, 3, false}, VariantCase{2, 7, 4, 2, 3, 3, true},
                              VariantCase{1, 6, 2, 1, 4, 1, true}, VariantCase{2, 5, 2, 2, 2, 0, true},
                              VariantCase{1, 5, 4, 1, 3, 9, false}}) {
    INFO("T " << c.T << " H " << c.H << " G " << c.G << " window " << c.window << " sinks " << c.sinks);
    const cpu::AttentionDims d{c.B, c.T, c.H, c.G, c.D};
    const double scale = 1 / std::sqrt(static_cast<double>(c.D));
    const std::int64_t no = c.B * c.T * c.H * c.D, nl = c.B * c.H * c.T;
    Vec qkv = testing::random_vec(rng, c.B * c.T * (c.H + 2 * c.G) * c.D);
    Vec sinks = testing::random_vec(rng, c.H, 2.0);
    cpu::ScoreTerms<double> terms;
    terms.sliding_window = c.window;
    if (c.sinks) terms.sinks = sinks.data();
    auto forward = [&] {
      Vec out(static_cast<std::size_t>(no)), lse(static_cast<std::size_t>(nl));
      cpu::attention_forward<double>(d, scale, qkv.data(), out.data(), lse.data(), terms);
      return std::pair{out, lse};
    };
    const auto [out, lse] = forward();
    Vec want_out(out.size()), want_lse(lse.size());
    naive_variant(c, scale, qkv, sinks, want_out, want_lse);
    CHECK(rel_err(out, want_out) < 1e-13);
    CHECK(rel_err(lse, want_lse) < 1e-13);
    if (c.window == 1 && !c.sinks) CHECK(out[0] == Approx(qkv[(c.H + c.G) * c.D]));

    const Vec dout = testing::random_vec(rng, no);
    Vec dqkv(qkv.size(), std::nan("")), dsinks(static_cast<std::size_t>(c.B * c.H), std::nan(""));
    cpu::attention_backward<double>(d, scale, dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), terms,
                                    nullptr, dsinks.data());
    auto loss = [&] { return testing::dot(dout, forward().first); };
    CHECK(rel_err(dqkv, testing::numeric_grad(qkv, loss)) < kFdTol);
    if (!c.sinks) continue;
    Vec dsink(static_cast<std::size_t>(c.H), 0.0);  // summed over the batch
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.H; ++h) dsink[h] += dsinks[b * c.H + h];
    CHECK(rel_err(dsink, testing::numeric_grad(sinks, loss)) < kFdTol);
  }
}

TEST_CASE("a sliding window's query window (context parallelism) gives the whole run's rows",
          "[cpu][attention-variants]") {
  std::mt19937_64 rng(testing::seed_for("windowed query rows"));
  const VariantCase c{2, 8, 2, 1, 4, 3, true};
  const double scale = 0.5;
  Vec qkv = testing::random_vec(rng, c.B * c.T * (c.H + 2 * c.G) * c.D), sinks = testing::random_vec(rng, c.H);
  cpu::ScoreTerms<double> terms;
  terms.sliding_window = c.window;
  terms.sinks = sinks.data();
  Vec out(static_cast<std::size_t>(c.B * c.T * c.H * c.D)), lse(static_cast<std::size_t>(c.B * c.H * c.T));
  cpu::attention_forward<double>({c.B, c.T, c.H, c.G, c.D}, scale, qkv.data(), out.data(), lse.data(), terms);
  // Rows 5..7 alone: keys 3..7 by position, as the whole run reads them (to rounding: the GEMMs differ in shape).
  const std::int64_t q0 = 5, Q = 3;
  Vec part(static_cast<std::size_t>(c.B * Q * c.H * c.D)), part_lse(static_cast<std::size_t>(c.B * c.H * Q));
  cpu::attention_forward<double>({c.B, c.T, c.H, c.G, c.D, q0, Q}, scale, qkv.data(), part.data(), part_lse.data(),
                                 terms);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t r = 0; r < Q; ++r)
      for (std::int64_t i = 0; i < c.H * c.D; ++i)
        REQUIRE(part[(b * Q + r) * c.H * c.D + i] == Approx(out[(b * c.T + q0 + r) * c.H * c.D + i]).epsilon(1e-13));
}

TEST_CASE("the cpu backend's sliding window and sinks: float kernels, sink gradients added into dsinks",
          "[cpu][attention-variants]") {
  std::mt19937_64 rng(testing::seed_for("backend attention variants"));
  const VariantCase c{2, 6, 4, 2, 4, 2, true};
  const double scale = 1 / std::sqrt(static_cast<double>(c.D));
  const Vec qkv = testing::random_vec(rng, c.B * c.T * (c.H + 2 * c.G) * c.D);
  const Vec sinks = testing::random_vec(rng, c.H), dout = testing::random_vec(rng, c.B * c.T * c.H * c.D);
  Vec want_out(dout.size()), want_lse(static_cast<std::size_t>(c.B * c.H * c.T));
  naive_variant(c, scale, qkv, sinks, want_out, want_lse);
  cpu::ScoreTerms<double> terms;
  terms.sliding_window = c.window;
  terms.sinks = sinks.data();
  Vec dqkv(qkv.size()), dsinks(static_cast<std::size_t>(c.B * c.H));
  cpu::attention_backward<double>({c.B, c.T, c.H, c.G, c.D}, scale, dout.data(), qkv.data(), want_out.data(),
                                  want_lse.data(), dqkv.data(), terms, nullptr, dsinks.data());

  CpuBackend be;
  AttentionOp op;
  op.heads = static_cast<int>(c.H), op.kv_heads = static_cast<int>(c.G), op.head_dim = static_cast<int>(c.D);
  op.scale = static_cast<float>(scale);
  op.sliding_window = c.window;
  op.sinks = upload(be, {c.H}, sinks);
  const Vec before = {1, -2, 3, 0.5};  // a gradient from an earlier micro-batch
  op.dsinks = upload(be, {c.H}, before);
  const BackendAttention got = backend_attention(be, op, c.B, c.T, qkv, dout);
  CHECK(rel_err(got.out, want_out) < 1e-5);
  CHECK(rel_err(got.lse, want_lse) < 1e-5);
  CHECK(rel_err(got.dqkv, dqkv) < kF32Tol);
  Vec want_dsinks = before;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) want_dsinks[h] += dsinks[b * c.H + h];
  CHECK(rel_err(download(be, op.dsinks), want_dsinks) < kF32Tol);
}

}  // namespace
}  // namespace meshtrain
