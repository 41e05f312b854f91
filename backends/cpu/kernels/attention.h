// Grouped-query attention, causal or not, with optional additive score terms
// (a per-head bias shared by the batch, a per-window mask), an optional
// sliding window (causal rows read only their last `sliding_window` keys)
// and optional attention sinks (a learned logit per head in every row's
// softmax denominator, as gpt-oss trains), forward and backward, with the softmax statistics kept as a log-sum-exp so backward
// recomputes the probabilities exactly (as flash attention does) instead of
// storing them.
// Legend: B batch, T sequence, H query heads, G kv heads, D head dim,
// W = (H + 2G)·D the width of one token's qkv row, M mask windows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/fast_math.h"
#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

struct AttentionDims {
  std::int64_t B, T, H, G, D;
  // The query window: rows [q0, q0 + Q) of T (AttentionOp::query_begin/rows); Q 0: all T.
  std::int64_t q0 = 0, Q = 0;
  std::int64_t width() const { return (H + 2 * G) * D; }
  std::int64_t rows() const { return Q > 0 ? Q : T; }
};

// What is added to the scaled scores before the softmax.
template <class T>
struct ScoreTerms {
  bool causal = true;
  const T* bias = nullptr;  // (H, T, T): head-major, the kernel's own layout
  const T* mask = nullptr;  // (M, T, T): batch entry b adds window b mod M
  std::int64_t windows = 1;
  std::int64_t sliding_window = 0;  // causal rows read keys t - sliding_window + 1 .. t; 0: from key 0
  const T* sinks = nullptr;         // (H): head h's sink logit joins every row's denominator

  // Keys a query row reads: [first_key(t), keys(t)): 0..t when causal (the
  // last sliding_window of them with a window), all T otherwise.
  std::int64_t first_key(std::int64_t t) const {
    return causal && sliding_window > 0 ? std::max<std::int64_t>(0, t - sliding_window + 1) : 0;
  }
  std::int64_t keys(std::int64_t t, std::int64_t Tn) const { return causal ? t + 1 : Tn; }
  // row (keys read by t) += bias and mask terms of (b, h, query t).
  void add(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t Tn, T* row) const {
    const std::int64_t lo = first_key(t), n = keys(t, Tn);
    if (bias != nullptr) {
      const T* r = bias + (h * Tn + t) * Tn;
      for (std::int64_t j = lo; j < n; ++j) row[j] += r[j];
    }
    if (mask != nullptr) {
      const T* r = mask + ((b % windows) * Tn + t) * Tn;
      for (std::int64_t j = lo; j < n; ++j) row[j] += r[j];
    }
  }
};

namespace detail {

// s (Q, T) = scale · q kᵀ for one head's window rows; q (at the window's
// first row), k strided by the token width.
template <class T>
void attention_scores(const AttentionDims& d, T scale, const T* q, const T* k, T* s) {
  ensure_single_threaded_blas();
  const std::int64_t W = d.width();
  blas_gemm(false, true, d.rows(), d.T, d.D, scale, q, W, k, W, T(0), s, d.T);
}

}  // namespace detail

// qkv (B, T, H + 2G, D) -> out (B, Q, H, D), lse (B, H, Q) for the window's Q query rows.
template <class T>
void attention_forward(const AttentionDims& d, T scale, const T* qkv, T* out, T* lse,
                       const ScoreTerms<T>& terms = {}) {
  const std::int64_t W = d.width(), R = d.H / d.G, Tn = d.T, Q = d.rows();
  const std::int64_t per_task = Q * Tn * d.D;
  for_chunks(
      d.B * d.H, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(per_task, 1)),
      [&](std::int64_t begin, std::int64_t end) {
        std::vector<T> p(static_cast<std::size_t>(Q * Tn));
        for (std::int64_t bh = begin; bh < end; ++bh) {
          const std::int64_t b = bh / d.H, h = bh % d.H, g = h / R;
          const T* base = qkv + b * Tn * W;
          detail::attention_scores(d, scale, base + d.q0 * W + h * d.D, base + (d.H + g) * d.D, p.data());
          for (std::int64_t r = 0; r < Q; ++r) {
            const std::int64_t t = d.q0 + r;
            T* row = p.data() + r * Tn;
            const std::int64_t lo = terms.first_key(t), n = terms.keys(t, Tn);
            terms.add(b, h, t, Tn, row);
            T m = row[lo];
            for (std::int64_t j = lo + 1; j < n; ++j) m = row[j] > m ? row[j] : m;
            if (terms.sinks != nullptr) m = std::max(m, terms.sinks[h]);
            // One exp per score (the loop vectorizes), then the ordered sum in
            // double, then normalise: P = exp(s - m) / z, lse = m + log z. A
            // sink adds its exp to z and takes no value.
            for (std::int64_t j = lo; j < n; ++j) row[j] = exp_approx(row[j] - m);
            double z = 0.0;
            for (std::int64_t j = lo; j < n; ++j) z += static_cast<double>(row[j]);
            if (terms.sinks != nullptr) z += std::exp(static_cast<double>(terms.sinks[h] - m));
            const T l = m + static_cast<T>(std::log(z)), inv = static_cast<T>(1.0 / z);
            for (std::int64_t j = lo; j < n; ++j) row[j] *= inv;
            for (std::int64_t j = 0; j < lo; ++j) row[j] = T(0);
            for (std::int64_t j = n; j < Tn; ++j) row[j] = T(0);
            lse[(b * d.H + h) * Q + r] = l;
          }
          blas_gemm(false, false, Q, d.D, Tn, T(1), p.data(), Tn, base + (d.H + d.G + g) * d.D, W,
                    T(0), out + b * Q * d.H * d.D + h * d.D, d.H * d.D);
        }
      });
}

// dqkv (B, T, H + 2G, D) overwritten from dout, out (B, Q, H, D), lse (B, H, Q)
// of the window's Q query rows (query gradients outside it are zero).
// One task per (b, kv head): the query heads sharing it add into its dk, dv
// in head order, so the sums are deterministic without atomics. With
// `dscores` (B, H, Q, T) the score gradient dS of every (b, h) is stored
// there too, for the caller to sum over the batch in a fixed order; with
// sinks, `dsinks` (B, H) gets each (b, h)'s sink gradient, for the same:
// -Σ_t P_sink(t) · D_t, P_sink = exp(sink - lse_t), D_t = dO_t · O_t.
template <class T>
void attention_backward(const AttentionDims& d, T scale, const T* dout, const T* qkv, const T* out,
                        const T* lse, T* dqkv, const ScoreTerms<T>& terms = {}, T* dscores = nullptr,
                        double* dsinks = nullptr) {
  const std::int64_t W = d.width(), R = d.H / d.G, Tn = d.T, Q = d.rows(), OW = d.H * d.D;
  for_chunks(d.B * d.G, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<T> p(static_cast<std::size_t>(Q * Tn)), dp(static_cast<std::size_t>(Q * Tn));
    std::vector<T> di(static_cast<std::size_t>(Q));
    for (std::int64_t bg = begin; bg < end; ++bg) {
      const std::int64_t b = bg / d.G, g = bg % d.G;
      const T* base = qkv + b * Tn * W;
      T* dbase = dqkv + b * Tn * W;
      const T* k = base + (d.H + g) * d.D;
      const T* v = base + (d.H + d.G + g) * d.D;
      T* dk = dbase + (d.H + g) * d.D;
      T* dv = dbase + (d.H + d.G + g) * d.D;
      for (std::int64_t t = 0; t < Tn; ++t)
        for (std::int64_t j = 0; j < d.D; ++j) dk[t * W + j] = dv[t * W + j] = T(0);
      for (std::int64_t h = g * R; h < (g + 1) * R; ++h) {
        // Query rows outside the window have no gradient.
        for (std::int64_t t = 0; t < Tn; ++t)
          if (t < d.q0 || t >= d.q0 + Q)
            for (std::int64_t j = 0; j < d.D; ++j) dbase[t * W + h * d.D + j] = T(0);
        const T* q = base + d.q0 * W + h * d.D;
        const T* o = out + b * Q * OW + h * d.D;
        const T* dout_h = dout + b * Q * OW + h * d.D;
        const T* l = lse + (b * d.H + h) * Q;
        detail::attention_scores(d, scale, q, k, p.data());
        for (std::int64_t r = 0; r < Q; ++r) {
          const std::int64_t t = d.q0 + r;
          T* row = p.data() + r * Tn;
          const std::int64_t lo = terms.first_key(t), n = terms.keys(t, Tn);
          terms.add(b, h, t, Tn, row);
          for (std::int64_t j = lo; j < n; ++j) row[j] = exp_approx(row[j] - l[r]);
          for (std::int64_t j = 0; j < lo; ++j) row[j] = T(0);
          for (std::int64_t j = n; j < Tn; ++j) row[j] = T(0);
          double s = 0.0;  // D_t = Σ_j P_tj dP_tj = dO_t · O_t
          for (std::int64_t j = 0; j < d.D; ++j)
            s += static_cast<double>(dout_h[r * OW + j]) * static_cast<double>(o[r * OW + j]);
          di[static_cast<std::size_t>(r)] = static_cast<T>(s);
        }
        if (terms.sinks != nullptr && dsinks != nullptr) {
          double acc = 0.0;
          for (std::int64_t r = 0; r < Q; ++r)
            acc -= std::exp(static_cast<double>(terms.sinks[h]) - static_cast<double>(l[r])) *
                   static_cast<double>(di[static_cast<std::size_t>(r)]);
          dsinks[b * d.H + h] = acc;
        }
        // dP (Q, T) = dO vᵀ; dS = P ∘ (dP - D) (zero where P is: above the diagonal when causal).
        blas_gemm(false, true, Q, Tn, d.D, T(1), dout_h, OW, v, W, T(0), dp.data(), Tn);
        for (std::int64_t r = 0; r < Q; ++r) {
          T* ds = dp.data() + r * Tn;
          const T* pr = p.data() + r * Tn;
          for (std::int64_t j = 0; j < Tn; ++j)
            ds[j] = pr[j] * (ds[j] - di[static_cast<std::size_t>(r)]);
        }
        if (dscores != nullptr)
          std::copy(dp.begin(), dp.end(), dscores + (b * d.H + h) * Q * Tn);
        blas_gemm(false, false, Q, d.D, Tn, scale, dp.data(), Tn, k, W, T(0), dbase + d.q0 * W + h * d.D, W);
        blas_gemm(true, false, Tn, d.D, Q, scale, dp.data(), Tn, q, W, T(1), dk, W);
        blas_gemm(true, false, Tn, d.D, Q, T(1), p.data(), Tn, dout_h, OW, T(1), dv, W);
      }
    }
  });
}

}  // namespace meshtrain::cpu
