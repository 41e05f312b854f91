// Normal draws for parameter initialisation, bit for bit those of
// backends/counter_rng.h's normal_at, at a few ns per element.
//
// normal_at spends most of its time in the C library's scalar log and cos.
// Here both are polynomials that GCC vectorizes (|error| < 1e-15 relative for
// log, < 1e-15 absolute for cos, against < 1e-12 allowed below). Each
// element's value r = stddev·sqrt(-2 log u1)·cos(2π u2) is then known to lie
// within ±e of the libm path's double, e = 2^-40·(|r| + |stddev|·sqrt(-2 log
// u1)), the second term covering cos near zero. Rounding to fp32 is monotone,
// so when r - e and r + e round to the same float, so does the libm value:
// that float is the answer. Otherwise (about 1 element in 30 000) the element
// is drawn by normal_at itself. The result never depends on which path ran.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backends/backend.h"
#include "backends/counter_rng.h"

namespace meshtrain::cpu {

namespace normal_detail {

// x < 2^53 as a double, exactly, in operations that vectorize without
// AVX-512's int64 conversions: two 26/27-bit halves through the 2^52 trick.
inline double u53_to_double(std::uint64_t x) {
  constexpr std::uint64_t kExp52 = 0x4330000000000000ULL;  // the bits of 2^52
  const double hi = std::bit_cast<double>((x >> 26) | kExp52) - 0x1p52;
  const double lo = std::bit_cast<double>((x & ((std::uint64_t{1} << 26) - 1)) | kExp52) - 0x1p52;
  return hi * 0x1p26 + lo;
}

// coeffs[0]·z^(N-1) + ... + coeffs[N-1] by Horner's rule: each step p·z + c, the
// order of operations the series' error bounds assume (a - b is a + (-b) exactly).
template <std::size_t N>
[[gnu::always_inline]] inline double horner(double z, const double (&coeffs)[N]) {
  double p = coeffs[0];
  for (std::size_t i = 1; i < N; ++i) p = p * z + coeffs[i];
  return p;
}

// log(u) for normal u > 0: u = 2^e·m with m in [√2/2, √2), log m = 2·atanh(s),
// s = (m - 1)/(m + 1), |s| <= 0.1716, as its series to s^21 (truncation
// < 1e-18 relative). m - 1 is exact, so the result is accurate relative to
// itself near u = 1 too (log 1 = 0 exactly).
inline double log_poly(double u) {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(u);
  double e = u53_to_double(bits >> 52) - 1023.0;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // [1, 2)
  const bool high = m > 1.4142135623730951;
  m = high ? m * 0.5 : m;
  e = high ? e + 1.0 : e;
  const double f = m - 1.0;
  const double s = f / (2.0 + f), z = s * s;
  constexpr double kAtanh[] = {2.0 / 21.0, 2.0 / 19.0, 2.0 / 17.0, 2.0 / 15.0, 2.0 / 13.0,
                               2.0 / 11.0, 2.0 / 9.0,  2.0 / 7.0,  2.0 / 5.0,  2.0 / 3.0};
  const double p = horner(z, kAtanh);
  const double log_m = 2.0 * s + s * (z * p);
  return e * 0.6931471805599453 + log_m;
}

// cos(x) for x in [0, 2π]: x = k·π/2 + r with |r| <= π/4 (Cody–Waite, π/2 in
// three parts whose first two are exact multiples for k <= 4), then the
// Taylor series of cos r or sin r to r^16 / r^17 (truncation < 1e-17).
inline double cos_poly(double x) {
  const double k = (x * 0.6366197723675814 + 0x1.8p52) - 0x1.8p52;  // the nearest integer, 0..4
  const double r = ((x - k * 0x1.921fb54400000p+0) - k * 0x1.0b4611a600000p-34) -
                   k * 0x1.3198a2e037073p-69;
  const double z = r * r;
  // (-1)^i / (2i)! and (-1)^i / (2i+1)!, from 1/16! and 1/17! down.
  constexpr double kCos[] = {1.0 / 20922789888000.0, -1.0 / 87178291200.0, 1.0 / 479001600.0,
                             -1.0 / 3628800.0,       1.0 / 40320.0,        -1.0 / 720.0,
                             1.0 / 24.0,             -0.5,                 1.0};
  constexpr double kSin[] = {1.0 / 355687428096000.0, -1.0 / 1307674368000.0, 1.0 / 6227020800.0,
                             -1.0 / 39916800.0,       1.0 / 362880.0,         -1.0 / 5040.0,
                             1.0 / 120.0,             -1.0 / 6.0};
  const double c = horner(z, kCos);
  const double s = r + r * (z * horner(z, kSin));
  // cos(kπ/2 + r) = cos r, -sin r, -cos r, sin r, cos r for k = 0, 1, 2, 3, 4.
  const double v = (k == 1.0 || k == 3.0) ? s : c;
  return (k == 1.0 || k == 2.0) ? -v : v;
}

}  // namespace normal_detail

// out[j] = fp32(stddev · normal_at(key, first + j)) for j < n, the same bits;
// returns how many elements normal_at drew itself. Defined in normal.cc,
// compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time
// (GCC target_clones); the results are the same on each.
std::int64_t normal_fill(std::uint64_t key, std::uint64_t first, std::int64_t n, double stddev, float* out);

// x (numel) per Backend::init_normal: normal_fill where op's runs (sorted by
// column, disjoint, within cols) cover, 0 elsewhere; in parallel over fixed
// chunks of x, so the values do not depend on the thread count either.
void init_normal(const NormalInitOp& op, std::int64_t numel, float* x);

// normal_fill for one block of at most kNormalBlock elements: the body every clone runs.
inline constexpr std::int64_t kNormalBlock = 64;
[[gnu::always_inline]] inline std::int64_t normal_fill_block(std::uint64_t key, std::uint64_t first,
                                                             std::int64_t len, double stddev, float* out) {
  using namespace normal_detail;
  std::int64_t unsure[kNormalBlock];
  for (std::int64_t j = 0; j < len; ++j) {
    const std::uint64_t i = first + static_cast<std::uint64_t>(j);
    const std::uint64_t ha = mix64(key ^ mix64(2 * i)), hb = mix64(key ^ mix64(2 * i + 1));
    const double u1 = (u53_to_double(ha >> 11) + 1.0) * 0x1.0p-53;  // as normal_at: exact
    const double u2 = u53_to_double(hb >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * log_poly(u1));
    const double r = stddev * (radius * cos_poly(6.283185307179586 * u2));
    const double margin = (std::fabs(r) + std::fabs(stddev) * radius) * 0x1p-40;
    const float lo = static_cast<float>(r - margin), hi = static_cast<float>(r + margin);
    out[j] = lo;
    unsure[j] = lo != hi;
  }
  std::int64_t drawn = 0;
  for (std::int64_t j = 0; j < len; ++j)
    if (unsure[j]) {
      out[j] = static_cast<float>(stddev * normal_at(key, first + static_cast<std::uint64_t>(j)));
      ++drawn;
    }
  return drawn;
}

}  // namespace meshtrain::cpu
