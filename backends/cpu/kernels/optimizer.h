// Gradient clipping coefficient and the AdamW update.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

template <class T>
T clip_coefficient(T sumsq, T max_norm) {
  const T c = max_norm / (std::sqrt(sumsq) + T(1e-6));
  return c < T(1) ? c : T(1);
}

struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  std::int64_t step;               // 1-based
  std::int64_t variance_frozen_at = 0;  // AdamWOp::variance_frozen_at
};

// The per-element constants of one AdamW step of one tensor.
template <class T>
struct AdamWStep {
  T b1, b2, c1, c2, lr, eps, decay, coef;
  AdamWStep(const AdamWParams& p, T clip_coef)
      : b1(static_cast<T>(p.beta1)),
        // Frozen: v = 1·v + 0·g² keeps v's bits.
        b2(static_cast<T>(p.variance_frozen_at > 0 ? 1.0 : p.beta2)),
        c1(static_cast<T>(1.0 / (1.0 - std::pow(p.beta1, static_cast<double>(p.step))))),
        c2(static_cast<T>(1.0 / (1.0 - std::pow(p.beta2, static_cast<double>(p.variance_frozen_at > 0
                                                                                   ? p.variance_frozen_at
                                                                                   : p.step))))),
        lr(static_cast<T>(p.lr)),
        eps(static_cast<T>(p.eps)),
        decay(static_cast<T>(1.0 - p.lr * p.weight_decay)),
        coef(clip_coef) {}

  // Elements [b, e). As PyTorch's AdamW: decay first (param ·= 1 - lr·wd),
  // then param -= lr · m̂ / (sqrt(v̂) + eps), with grad · coef.
  void apply(std::int64_t b, std::int64_t e, T* param, const T* grad, T* m, T* v) const {
    for (std::int64_t i = b; i < e; ++i) {
      const T g = grad[i] * coef;
      m[i] = b1 * m[i] + (T(1) - b1) * g;
      v[i] = b2 * v[i] + (T(1) - b2) * g * g;
      param[i] = param[i] * decay - lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
    }
  }
};

// param, m, v (n) in place from grad (n) · coef.
template <class T>
void adamw(std::int64_t n, T* param, const T* grad, T* m, T* v, T coef, const AdamWParams& p) {
  const AdamWStep<T> step(p, coef);
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) { step.apply(b, e, param, grad, m, v); });
}

// One tensor of a multi-tensor AdamW step.
template <class T>
struct AdamWArrays {
  std::int64_t n;
  T* param;
  const T* grad;
  T* m;
  T* v;
  AdamWStep<T> step;
};

// adamw() of each tensor, as one parallel loop over all their kGrain chunks.
template <class T>
void foreach_adamw(const std::vector<AdamWArrays<T>>& tensors) {
  std::vector<ArrayChunk> chunks = array_chunks(tensors.size(), [&](std::size_t i) { return tensors[i].n; });
  for_chunks(static_cast<std::int64_t>(chunks.size()), 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t c = b; c < e; ++c) {
      const ArrayChunk& k = chunks[static_cast<std::size_t>(c)];
      const AdamWArrays<T>& t = tensors[k.array];
      t.step.apply(k.begin, k.end, t.param, t.grad, t.m, t.v);
    }
  });
}

}  // namespace meshtrain::cpu
