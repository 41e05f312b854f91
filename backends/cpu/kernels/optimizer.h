// Gradient clipping coefficient and the AdamW update.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

template <class T>
T clip_coefficient(T sumsq, T max_norm) {
  const T c = max_norm / (std::sqrt(sumsq) + T(1e-6));
  return c < T(1) ? c : T(1);
}

struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  std::int64_t step;  // 1-based
};

// param, m, v (n) in place from grad (n) · coef. As PyTorch's AdamW: decay
// first (param ·= 1 - lr·wd), then param -= lr · m̂ / (sqrt(v̂) + eps).
template <class T>
void adamw(std::int64_t n, T* param, const T* grad, T* m, T* v, T coef, const AdamWParams& p) {
  const T b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T c1 = static_cast<T>(1.0 / (1.0 - std::pow(p.beta1, static_cast<double>(p.step))));
  const T c2 = static_cast<T>(1.0 / (1.0 - std::pow(p.beta2, static_cast<double>(p.step))));
  const T lr = static_cast<T>(p.lr), eps = static_cast<T>(p.eps);
  const T decay = static_cast<T>(1.0 - p.lr * p.weight_decay);
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T g = grad[i] * coef;
      m[i] = b1 * m[i] + (T(1) - b1) * g;
      v[i] = b2 * v[i] + (T(1) - b2) * g * g;
      param[i] = param[i] * decay - lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
    }
  });
}

}  // namespace meshtrain::cpu
