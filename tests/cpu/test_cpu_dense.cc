// GEMM (all transposes, bias, beta), batched GEMM, bias_backward, the
// elementwise ops and whole-tensor reductions, embedding with vocab shards.
#include <limits>

#include "backends/cpu/kernels/elementwise.h"
#include "backends/cpu/kernels/embedding.h"
#include "backends/cpu/kernels/gemm.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using namespace testing;  // cpu_test_util.h

// The gradients of L = Σ w ∘ c for c = alpha·op(a) op(b) + beta·c0 + bias,
// written as the engine will write them: as GEMMs and a bias_backward.
struct GemmGrads {
  Vec da, db, dc0, dbias;
};

GemmGrads gemm_backward(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                        double alpha, double beta, const Vec& a, const Vec& b, const Vec& w) {
  GemmGrads g{Vec(a.size()), Vec(b.size()), Vec(w.size()), Vec(static_cast<std::size_t>(n), 0.0)};
  // da: (m, k) = alpha w op(b)ᵀ, or (k, m) = alpha op(b) wᵀ when ta.
  if (!ta)
    cpu::gemm<double>(false, !tb, m, k, n, alpha, w.data(), b.data(), 0, g.da.data(), nullptr);
  else
    cpu::gemm<double>(tb, true, k, m, n, alpha, b.data(), w.data(), 0, g.da.data(), nullptr);
  // db: (k, n) = alpha op(a)ᵀ w, or (n, k) = alpha wᵀ op(a) when tb.
  if (!tb)
    cpu::gemm<double>(!ta, false, k, n, m, alpha, a.data(), w.data(), 0, g.db.data(), nullptr);
  else
    cpu::gemm<double>(true, ta, n, k, m, alpha, w.data(), a.data(), 0, g.db.data(), nullptr);
  for (std::size_t i = 0; i < w.size(); ++i) g.dc0[i] = beta * w[i];
  cpu::bias_backward<double>(m, n, w.data(), g.dbias.data());
  return g;
}

GemmOp transposed(bool ta, bool tb, double alpha) {
  GemmOp op;
  op.trans_a = ta;
  op.trans_b = tb;
  op.alpha = static_cast<float>(alpha);
  return op;
}

TEST_CASE("cpu gemm: every transpose with bias and beta, gradients by finite differences",
          "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("gemm"));
  const std::int64_t m = 3, n = 4, k = 5;
  const double alpha = 0.75, beta = 0.5;
  CpuBackend be;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      Vec a = testing::random_vec(rng, m * k), b = testing::random_vec(rng, k * n);
      Vec c0 = testing::random_vec(rng, m * n), bias = testing::random_vec(rng, n);
      const Vec w = testing::random_vec(rng, m * n);
      auto forward = [&] {
        Vec c = c0;
        cpu::gemm<double>(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data(), bias.data());
        return c;
      };
      // The forward against a naive triple loop.
      const Vec c = forward();
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t p = 0; p < k; ++p)
            s += a[ta ? p * m + i : i * k + p] * b[tb ? j * k + p : p * n + j];
          REQUIRE(c[i * n + j] ==
                  Approx(alpha * s + beta * c0[i * n + j] + bias[j]).epsilon(1e-12));
        }
      const auto loss = [&] { return testing::dot(w, forward()); };
      const GemmGrads g = gemm_backward(ta, tb, m, n, k, alpha, beta, a, b, w);
      CHECK(rel_err(g.da, testing::numeric_grad(a, loss)) < testing::kFdTol);
      CHECK(rel_err(g.db, testing::numeric_grad(b, loss)) < testing::kFdTol);
      CHECK(rel_err(g.dc0, testing::numeric_grad(c0, loss)) < testing::kFdTol);
      CHECK(rel_err(g.dbias, testing::numeric_grad(bias, loss)) < testing::kFdTol);

      // The fp32 backend, forward and the same backward GEMMs.
      const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
      Tensor ta_ = upload(be, sa, a), tb_ = upload(be, sb, b), tc = upload(be, {m, n}, c0);
      GemmOp op{ta, tb, static_cast<float>(alpha), static_cast<float>(beta), upload(be, {n}, bias)};
      be.gemm(ta_, tb_, tc, op);
      CHECK(rel_err(download(be, tc), c) < 1e-6);
      Tensor tw = upload(be, {m, n}, w), da = be.empty(sa), db = be.empty(sb);
      if (!ta)
        be.gemm(tw, tb_, da, transposed(false, !tb, alpha));
      else
        be.gemm(tb_, tw, da, transposed(tb, true, alpha));
      if (!tb)
        be.gemm(ta_, tw, db, transposed(!ta, false, alpha));
      else
        be.gemm(tw, ta_, db, transposed(true, ta, alpha));
      CHECK(rel_err(download(be, da), g.da) < testing::kF32Tol);
      CHECK(rel_err(download(be, db), g.db) < testing::kF32Tol);
    }
}

TEST_CASE("cpu gemm views rank-3 operands as matrices and ignores c when beta is 0", "[cpu]") {
  CpuBackend be;
  Tensor a = upload(be, {2, 1, 2}, {1, 2, 3, 4});  // (2, 2)
  Tensor b = upload(be, {2, 2}, {1, 0, 0, 1});
  Tensor c = be.empty({2, 1, 2});
  be.fill(c, std::numeric_limits<float>::quiet_NaN());
  be.gemm(a, b, c, GemmOp{});
  CHECK(download(be, c) == Vec{1, 2, 3, 4});
}

TEST_CASE("cpu batched_gemm equals one gemm per matrix", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("batched_gemm"));
  const std::int64_t L = 3, m = 2, n = 3, k = 4;
  CpuBackend be;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      const Vec a = testing::random_vec(rng, L * m * k), b = testing::random_vec(rng, L * k * n);
      const Vec c0 = testing::random_vec(rng, L * m * n), bias = testing::random_vec(rng, n);
      Vec want = c0;
      for (std::int64_t l = 0; l < L; ++l)
        cpu::gemm<double>(ta, tb, m, n, k, 1.5, a.data() + l * m * k, b.data() + l * k * n, 0.25,
                          want.data() + l * m * n, bias.data());
      Tensor ta_ = upload(be, ta ? Shape{L, k, m} : Shape{L, m, k}, a);
      Tensor tb_ = upload(be, tb ? Shape{L, n, k} : Shape{L, k, n}, b);
      Tensor tc = upload(be, {L, m, n}, c0);
      be.batched_gemm(ta_, tb_, tc, GemmOp{ta, tb, 1.5f, 0.25f, upload(be, {n}, bias)});
      CHECK(rel_err(download(be, tc), want) < 1e-6);
    }
}

TEST_CASE("cpu bias_backward accumulates column sums", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("bias_backward"));
  const std::int64_t m = 300, n = 7;  // several row chunks
  const Vec dy = testing::random_vec(rng, m * n), db0 = testing::random_vec(rng, n);
  Vec want = db0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) want[j] += dy[i * n + j];
  Vec got64 = db0;
  cpu::bias_backward<double>(m, n, dy.data(), got64.data());
  CHECK(rel_err(got64, want) < 1e-14);
  CpuBackend be;
  Tensor tdb = upload(be, {n}, db0);
  be.bias_backward(upload(be, {m, n}, dy), tdb);
  CHECK(rel_err(download(be, tdb), want) < 1e-6);
}

TEST_CASE("cpu elementwise ops, sum and sum_squares", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("elementwise"));
  const std::int64_t n = 40000;  // more than one chunk
  const Vec x = testing::random_vec(rng, n), y = testing::random_vec(rng, n);
  CpuBackend be;
  Tensor tx = upload(be, {n}, x), ty = upload(be, {n}, y), out = be.empty({n});
  be.add(tx, ty, out);
  be.add(out, ty, out);  // out aliases a
  be.axpy(-2.f, ty, out);
  be.scale(out, 3.f);
  const Vec got = download(be, out);
  for (std::int64_t i = 0; i < n; i += 997) CHECK(got[i] == Approx(3 * x[i]).margin(1e-5));
  double s = 0, ss = 0;
  for (double v : x) {
    s += static_cast<float>(v);
    ss += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
  }
  Tensor r = be.empty({1});
  be.sum(tx, r, 0.5f, false);
  CHECK(download(be, r)[0] == Approx(0.5 * s).epsilon(1e-6));
  be.sum(tx, r, 0.5f, true);
  CHECK(download(be, r)[0] == Approx(s).epsilon(1e-6));
  be.sum_squares(tx, r, false);
  CHECK(download(be, r)[0] == Approx(ss).epsilon(1e-6));
  be.sum_squares(tx, r, true);
  CHECK(download(be, r)[0] == Approx(2 * ss).epsilon(1e-6));
  CHECK(cpu::sum_squares<double>(n, x.data()) == Approx(testing::dot(x, x)).epsilon(1e-13));
}

TEST_CASE("cpu embedding forward/backward with a vocabulary shard", "[cpu]") {
  std::mt19937_64 rng(testing::seed_for("embedding"));
  const std::int64_t V = 10, C = 3, half = 5;
  const std::vector<std::int32_t> ids{0, 7, 7, 3, 9, 5, 7, 1, 4, 9, 2, 2};
  const auto N = static_cast<std::int64_t>(ids.size());
  Vec table = testing::random_vec(rng, V * C);
  const Vec w = testing::random_vec(rng, N * C);
  auto forward = [&](const Vec& t, std::int64_t rows, std::int64_t offset) {
    Vec out(static_cast<std::size_t>(N * C));
    cpu::embedding_forward<double>(N, C, rows, offset, t.data(), ids.data(), out.data());
    return out;
  };
  // Gradient of Σ w ∘ out by finite differences, accumulated onto a start value.
  const Vec start = testing::random_vec(rng, V * C);
  Vec dtable = start;
  cpu::embedding_backward<double>(N, C, V, 0, w.data(), ids.data(), dtable.data());
  Vec delta(dtable.size());
  for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = dtable[i] - start[i];
  const Vec fd =
      testing::numeric_grad(table, [&] { return testing::dot(w, forward(table, V, 0)); });
  CHECK(rel_err(delta, fd) < testing::kFdTol);

  CpuBackend be;
  Tensor tids = testing::upload_ids(be, ids), tw = upload(be, {N, C}, w);
  Tensor full_out = be.empty({N, C});
  be.embedding_forward(upload(be, {V, C}, table), tids, full_out, 0);
  const Vec full = download(be, full_out);
  Tensor tdfull = upload(be, {V, C}, start);
  be.embedding_backward(tw, tids, tdfull, 0);
  CHECK(rel_err(download(be, tdfull), dtable) < 1e-6);
  // Shard s holds rows [s·half, (s+1)·half): its lookup is the full lookup
  // where it owns the id and zero elsewhere; its gradient is the full one's rows.
  for (std::int64_t s = 0; s < 2; ++s) {
    Vec shard(table.begin() + s * half * C, table.begin() + (s + 1) * half * C);
    Tensor out = be.empty({N, C});
    be.embedding_forward(upload(be, {half, C}, shard), tids, out, s * half);
    const Vec got = download(be, out);
    for (std::int64_t i = 0; i < N; ++i) {
      const bool owned = ids[i] >= s * half && ids[i] < (s + 1) * half;
      for (std::int64_t j = 0; j < C; ++j)
        REQUIRE(got[i * C + j] == (owned ? full[i * C + j] : 0.0));
    }
    Vec shard_start(start.begin() + s * half * C, start.begin() + (s + 1) * half * C);
    Tensor tds = upload(be, {half, C}, shard_start);
    be.embedding_backward(tw, tids, tds, s * half);
    const Vec want(dtable.begin() + s * half * C, dtable.begin() + (s + 1) * half * C);
    CHECK(rel_err(download(be, tds), want) < 1e-6);
  }
}

}  // namespace
}  // namespace meshtrain
