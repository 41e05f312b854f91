// exp and tanh for the fp32 kernels, branch-free so that the loops calling
// them vectorize (the cpu backend is built with -fno-math-errno
// -fno-trapping-math, backends/cpu/CMakeLists.txt). glibc's expf and tanhf
// are scalar calls of 7-60 ns on this class of machine; softmax, cross-entropy
// and GELU spent most of their time in them. The fp64 overloads keep the
// library functions: the fp64 instantiations are the tests' references.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace meshtrain::cpu {

// Eigen's rational approximation (generic_fast_tanh_float: odd degree-13 over
// even degree-6 polynomial, clamped where tanh rounds to ±1), within 4e-7
// relative of tanh (tests/cpu check it). glibc's tanhf made GELU a third of a
// GPT step.
inline float tanh_approx(float a) {
  constexpr float kClamp = 7.90531110763549805f;
  const float x = std::min(std::max(a, -kClamp), kClamp);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  // Below 4e-4, tanh(x) rounds to x in fp32 while p/q would lose bits.
  const float r = p / q;
  return std::abs(a) < 0.0004f ? a : r;
}
inline double tanh_approx(double a) { return std::tanh(a); }

// Cephes' expf: exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x - n·ln 2 in
// two parts, exp(r) by a degree-6 polynomial; within 1e-7 relative (tests/cpu
// check it). Below -87 it returns 0 (exp underflows to subnormals there, which
// are slow and, next to the 1 a softmax row always holds, nothing); above 88
// it saturates at exp(88) ≈ 1.7e38. Callers pass x - max(x) <= 0, or silu's
// exp(-g), where 1 / (1 + exp(88)) is 0 to fp32 precision anyway.
inline float exp_approx(float a) {
  const float x = std::min(std::max(a, -87.0f), 88.0f);
  const float t = x * 1.44269504088896341f + 0.5f;
  const std::int32_t ti = static_cast<std::int32_t>(t);
  const std::int32_t n = ti - (static_cast<float>(ti) > t ? 1 : 0);  // floor(t), vectorizable
  const float fn = static_cast<float>(n);
  float r = x - fn * 0.693359375f;  // ln 2 = 0.693359375 - 2.12194440e-4, exactly in the first part
  r = r - fn * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const float e = y * std::bit_cast<float>((n + 127) << 23);
  return a < -87.0f ? 0.0f : e;  // NaN compares false: NaN in, NaN out
}
inline double exp_approx(double a) { return std::exp(a); }

}  // namespace meshtrain::cpu
