// Rotary position embedding. Legend: B batch, T sequence, D head dim.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

// x (B, T, heads_total, D), in place: pairs (2i, 2i+1) of the first
// rotate_heads heads of token t rotate by (t0 + t) · theta^(-2i/D) (by its
// negative when inverse). Angles are computed in double, once per (t, i).
template <class T>
void rope(std::int64_t B, std::int64_t Tn, std::int64_t heads_total, std::int64_t rotate_heads,
          std::int64_t D, double theta, bool inverse, std::int64_t t0, T* x) {
  const std::int64_t P = D / 2;
  std::vector<T> cs(static_cast<std::size_t>(Tn * P)), sn(static_cast<std::size_t>(Tn * P));
  for (std::int64_t i = 0; i < P; ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    for (std::int64_t t = 0; t < Tn; ++t) {
      const double a = static_cast<double>(t0 + t) * freq;
      cs[static_cast<std::size_t>(t * P + i)] = static_cast<T>(std::cos(a));
      sn[static_cast<std::size_t>(t * P + i)] =
          static_cast<T>(inverse ? -std::sin(a) : std::sin(a));
    }
  }
  for_rows(B * Tn, rotate_heads * D, [&](std::int64_t row) {
    const std::int64_t t = row % Tn;
    const T* c = cs.data() + t * P;
    const T* s = sn.data() + t * P;
    for (std::int64_t h = 0; h < rotate_heads; ++h) {
      T* v = x + (row * heads_total + h) * D;
      for (std::int64_t i = 0; i < P; ++i) {
        const T x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    }
  });
}

}  // namespace meshtrain::cpu
