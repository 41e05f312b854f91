// The cpu backend's mixture-of-experts ops against naive references in
// double: the router (softmax, top-k with ties to the lower expert,
// renormalisation), its backward against central differences of the
// objective it differentiates, and the weighted combine with its backward.
#include <algorithm>
#include <numeric>

#include "tests/cpu/cpu_test_util.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

constexpr int N = 6, E = 5, K = 2;

struct Route {
  Vec probs, lse, weights;
  std::vector<std::int32_t> experts;
};

// The router in double; `chosen` fixes the experts (differentiating needs a fixed top-k).
Route naive_route(const Vec& logits, bool renormalize, const std::vector<std::int32_t>* chosen = nullptr) {
  Route r;
  r.probs.resize(N * E), r.lse.resize(N), r.weights.resize(N * K), r.experts.resize(N * K);
  for (int n = 0; n < N; ++n) {
    double max = -1e300, sum = 0;
    for (int e = 0; e < E; ++e) max = std::max(max, logits[n * E + e]);
    for (int e = 0; e < E; ++e) sum += std::exp(logits[n * E + e] - max);
    r.lse[n] = max + std::log(sum);
    for (int e = 0; e < E; ++e) r.probs[n * E + e] = std::exp(logits[n * E + e] - r.lse[n]);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return r.probs[n * E + a] > r.probs[n * E + b]; });
    double total = 0;
    for (int k = 0; k < K; ++k) {
      r.experts[n * K + k] = chosen ? (*chosen)[n * K + k] : order[k];
      total += r.probs[n * E + r.experts[n * K + k]];
    }
    for (int k = 0; k < K; ++k)
      r.weights[n * K + k] = r.probs[n * E + r.experts[n * K + k]] / (renormalize ? total : 1.0);
  }
  return r;
}

// The cpu backend's router on (N, E) logits.
struct Routed {
  Tensor probs, lse, weights, experts;
};
Routed route(CpuBackend& b, const Vec& logits, bool renormalize) {
  Routed r{b.empty({N, E}), b.empty({N}), b.empty({N, K}), b.empty({N, K}, DType::i32)};
  b.moe_route(upload(b, {N, E}, logits), renormalize, r.probs, r.lse, r.weights, r.experts);
  return r;
}

}  // namespace

TEST_CASE("moe_route: softmax, top-k in descending order with ties to the lower expert, renormalised or not",
          "[cpu][moe]") {
  std::mt19937_64 rng(seed_for("moe_route"));
  Vec logits = random_vec(rng, N * E);
  logits[3 * E + 1] = logits[3 * E + 3] = 5.0;  // a tie for row 3's first place: expert 1 first
  for (bool renormalize : {true, false}) {
    INFO("renormalize " << renormalize);
    CpuBackend b;
    const Routed r = route(b, logits, renormalize);
    const Route ref = naive_route(logits, renormalize);
    CHECK(rel_err(download(b, r.probs), ref.probs) < 1e-6);
    CHECK(rel_err(download(b, r.lse), ref.lse) < 1e-6);
    CHECK(rel_err(download(b, r.weights), ref.weights) < 1e-6);
    const Vec got = download(b, r.experts);
    for (int i = 0; i < N * K; ++i) CHECK(got[i] == ref.experts[i]);
    CHECK(got[3 * K] == 1);
    CHECK(got[3 * K + 1] == 3);
  }
}

TEST_CASE("moe_route_backward matches central differences of weights, balance and z-loss terms", "[cpu][moe]") {
  std::mt19937_64 rng(seed_for("moe_route_backward"));
  Vec logits = random_vec(rng, N * E), dweights = random_vec(rng, N * K), prob_grad = random_vec(rng, E);
  const double z_scale = 0.3;
  for (bool renormalize : {true, false}) {
    INFO("renormalize " << renormalize);
    CpuBackend b;
    const Routed routed = route(b, logits, renormalize);
    Tensor dl = b.empty({N, E});
    b.moe_route_backward(upload(b, {N, K}, dweights), routed.probs, routed.lse, routed.experts, upload(b, {E}, prob_grad),
                         static_cast<float>(z_scale), renormalize, dl);
    const std::vector<std::int32_t> chosen = naive_route(logits, renormalize).experts;
    auto objective = [&] {
      const Route r = naive_route(logits, renormalize, &chosen);
      double j = dot(dweights, r.weights);
      for (int n = 0; n < N; ++n) {
        for (int e = 0; e < E; ++e) j += prob_grad[e] * r.probs[n * E + e];
        j += z_scale * r.lse[n] * r.lse[n];
      }
      return j;
    };
    CHECK(rel_err(download(b, dl), numeric_grad(logits, objective)) < 1e-5);
  }
}

TEST_CASE("moe_combine sums each token's slots, skips dropped ones, its backward", "[cpu][moe]") {
  std::mt19937_64 rng(seed_for("moe_combine"));
  constexpr int M = 9, C = 7;
  // Each row read by one slot at most; dropped slots (-1), token 4 with both
  // dropped (a zero row), rows 8 unread.
  const std::vector<std::int32_t> idx = {3, 0, 7, -1, 1, 2, 6, 4, -1, -1, 5, -1};
  const Vec rows = random_vec(rng, M * C), weights = random_vec(rng, N * K), dout = random_vec(rng, N * C);
  CpuBackend b;
  Tensor r = upload(b, {M, C}, rows), w = upload(b, {N, K}, weights), out = b.empty({N, C});
  Tensor it = b.empty({N, K}, DType::i32);
  b.write(it, idx);
  b.moe_combine(r, it, w, out);
  Vec ref(N * C, 0.0), drows_ref(M * C, 0.0), dw_ref(N * K, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const int i = idx[n * K + k];
      if (i < 0) continue;
      for (int c = 0; c < C; ++c) {
        ref[n * C + c] += weights[n * K + k] * rows[i * C + c];
        drows_ref[i * C + c] = weights[n * K + k] * dout[n * C + c];
        dw_ref[n * K + k] += dout[n * C + c] * rows[i * C + c];
      }
    }
  CHECK(rel_err(download(b, out), ref) < 1e-6);
  Tensor drows = b.empty({M, C}), dw = b.empty({N, K});
  b.fill(drows, 7.f);  // overwritten, unread rows included
  b.moe_combine_backward(upload(b, {N, C}, dout), r, it, w, drows, dw);
  CHECK(rel_err(download(b, drows), drows_ref) < 1e-6);
  CHECK(rel_err(download(b, dw), dw_ref) < 1e-6);
}
