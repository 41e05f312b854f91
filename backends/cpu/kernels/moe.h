// Mixture-of-experts kernels: the router (softmax, top-k, renormalisation)
// with its backward, and the weighted combine of a token's expert outputs.
// Legend: N tokens, E experts, K experts per token, M expert-output rows, C width.
// Rows are independent, so every kernel runs row-parallel over fixed chunks;
// per-row sums run in double (router) or in slot order in float (combine), so
// the bits do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

// probs (N, E) = softmax(logits), lse (N), experts (N, K) the K largest in
// descending order (ties: lower expert), weights (N, K) their probabilities
// (renormalised to sum 1 when `renormalize`).
inline void moe_route(std::int64_t N, std::int64_t E, std::int64_t K, bool renormalize, const float* logits,
                      float* probs, float* lse, float* weights, std::int32_t* experts) {
  for_rows(N, E, [&](std::int64_t n) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    double max = l[0];
    for (std::int64_t e = 1; e < E; ++e) max = std::max(max, static_cast<double>(l[e]));
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - max);
    const double log_sum = max + std::log(sum);
    lse[n] = static_cast<float>(log_sum);
    for (std::int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - log_sum));
    std::int32_t* chosen = experts + n * K;
    float* w = weights + n * K;
    double total = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (std::int64_t j = 0; j < k; ++j) taken = taken || chosen[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;  // strict: ties keep the lower expert
      }
      chosen[k] = static_cast<std::int32_t>(best);
      total += p[best];
    }
    for (std::int64_t k = 0; k < K; ++k)
      w[k] = renormalize ? static_cast<float>(p[chosen[k]] / total) : p[chosen[k]];
  });
}

// dlogits (N, E): see Backend::moe_route_backward.
inline void moe_route_backward(std::int64_t N, std::int64_t E, std::int64_t K, bool renormalize,
                               const float* dweights, const float* probs, const float* lse,
                               const std::int32_t* experts, const float* prob_grad, float z_scale,
                               float* dlogits) {
  for_rows(N, E, [&](std::int64_t n) {
    const float* p = probs + n * E;
    const std::int32_t* chosen = experts + n * K;
    const float* dw = dweights + n * K;
    std::vector<double> g(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) g[static_cast<std::size_t>(e)] = prob_grad[e];
    if (renormalize) {
      // w_j = p_j / s with s = Σ_k p_k: ∂/∂p_j = (dw_j - Σ_k dw_k w_k) / s.
      double s = 0, dot = 0;
      for (std::int64_t k = 0; k < K; ++k) s += p[chosen[k]];
      for (std::int64_t k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * (p[chosen[k]] / s);
      for (std::int64_t k = 0; k < K; ++k) g[static_cast<std::size_t>(chosen[k])] += (dw[k] - dot) / s;
    } else {
      for (std::int64_t k = 0; k < K; ++k) g[static_cast<std::size_t>(chosen[k])] += dw[k];
    }
    double pg = 0;
    for (std::int64_t e = 0; e < E; ++e) pg += static_cast<double>(p[e]) * g[static_cast<std::size_t>(e)];
    // Softmax backward, plus z_scale · ∂lse²/∂l = z_scale · 2 · lse · p.
    const double z = 2.0 * static_cast<double>(z_scale) * lse[n];
    float* d = dlogits + n * E;
    for (std::int64_t e = 0; e < E; ++e)
      d[e] = static_cast<float>(p[e] * (g[static_cast<std::size_t>(e)] - pg) + z * p[e]);
  });
}

// out (N, C) row n = Σ_k weights[n,k] · rows[index[n,k]] in slot order, skipping index < 0.
template <class T>
void moe_combine(std::int64_t N, std::int64_t K, std::int64_t C, const T* rows, const std::int32_t* index,
                 const float* weights, T* out) {
  for_rows(N, C * K, [&](std::int64_t n) {
    T* o = out + n * C;
    for (std::int64_t c = 0; c < C; ++c) o[c] = T(0);
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = index[n * K + k];
      if (i < 0) continue;
      const float w = weights[n * K + k];
      const T* r = rows + static_cast<std::int64_t>(i) * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] += w * r[c];
    }
  });
}

// drows (M, C) and dweights (N, K), both overwritten: see Backend::moe_combine_backward.
template <class T>
void moe_combine_backward(std::int64_t N, std::int64_t K, std::int64_t C, std::int64_t M, const T* dout,
                          const T* rows, const std::int32_t* index, const float* weights, T* drows,
                          float* dweights) {
  for_rows(M, C, [&](std::int64_t m) {
    T* d = drows + m * C;
    for (std::int64_t c = 0; c < C; ++c) d[c] = T(0);
  });
  // Each row of `rows` is read by one slot at most: the writes never collide.
  for_rows(N, C * K, [&](std::int64_t n) {
    const T* g = dout + n * C;
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = index[n * K + k];
      if (i < 0) {
        dweights[n * K + k] = 0.f;
        continue;
      }
      const float w = weights[n * K + k];
      const T* r = rows + static_cast<std::int64_t>(i) * C;
      T* d = drows + static_cast<std::int64_t>(i) * C;
      double dot = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        d[c] = w * g[c];
        dot += static_cast<double>(g[c]) * r[c];
      }
      dweights[n * K + k] = static_cast<float>(dot);
    }
  });
}

}  // namespace meshtrain::cpu
