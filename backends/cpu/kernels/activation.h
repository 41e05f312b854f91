// GELU (tanh approximation), SwiGLU and counter-based dropout.
// Legend: N rows, F ffn width.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels/fast_math.h"
#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

template <class T>
void gelu_forward(std::int64_t n, const T* x, T* out) {
  const T k = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T v = x[i];
      out[i] = T(0.5) * v * (T(1) + tanh_approx(k * (v + T(0.044715) * v * v * v)));
    }
  });
}

// dx overwritten.
template <class T>
void gelu_backward(std::int64_t n, const T* dout, const T* x, T* dx) {
  const T k = static_cast<T>(0.7978845608028654);
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const T v = x[i];
      const T t = tanh_approx(k * (v + T(0.044715) * v * v * v));
      const T dt = k * (T(1) + T(3) * T(0.044715) * v * v) * (T(1) - t * t);
      dx[i] = dout[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * dt);
    }
  });
}

// x (N, 2F) = [gate | up] per row -> out (N, F) = silu(gate) · up.
template <class T>
void swiglu_forward(std::int64_t N, std::int64_t F, const T* x, T* out) {
  for_rows(N, 2 * F, [&](std::int64_t r) {
    const T* g = x + r * 2 * F;
    const T* u = g + F;
    T* o = out + r * F;
    for (std::int64_t j = 0; j < F; ++j) o[j] = g[j] / (T(1) + exp_approx(-g[j])) * u[j];
  });
}

// dx (N, 2F) overwritten from dout (N, F).
template <class T>
void swiglu_backward(std::int64_t N, std::int64_t F, const T* dout, const T* x, T* dx) {
  for_rows(N, 2 * F, [&](std::int64_t r) {
    const T* g = x + r * 2 * F;
    const T* u = g + F;
    const T* d = dout + r * F;
    T* dg = dx + r * 2 * F;
    T* du = dg + F;
    for (std::int64_t j = 0; j < F; ++j) {
      const T s = T(1) / (T(1) + exp_approx(-g[j]));
      du[j] = d[j] * g[j] * s;
      dg[j] = d[j] * u[j] * s * (T(1) + g[j] * (T(1) - s));
    }
  });
}

// splitmix64's finaliser: a bijective 64-bit mix with full avalanche.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Whether element `counter` survives dropout with probability p: a pure
// function of (seed, counter), uniform on a 2^-24 grid.
inline bool dropout_keep(std::uint64_t seed, std::uint64_t counter, float p) {
  const std::uint64_t h = mix64(mix64(seed ^ 0x9e3779b97f4a7c15ull) + counter);
  const float u = static_cast<float>(h >> 40) * 0x1p-24f;  // [0, 1)
  return u >= p;
}

// out = x / (1 - p) where kept, else 0; element i draws counter offset + i.
// In place (out == x) is allowed.
template <class T>
void dropout(std::int64_t n, const T* x, T* out, float p, std::uint64_t seed,
             std::uint64_t offset) {
  const T s = p < 1.0f ? T(1) / (T(1) - static_cast<T>(p)) : T(0);
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      out[i] = dropout_keep(seed, offset + static_cast<std::uint64_t>(i), p) ? x[i] * s : T(0);
  });
}

}  // namespace meshtrain::cpu
