// bf16 and IEEE fp16 <-> fp32 conversions on the host, round to nearest
// even, with subnormals, infinities and NaN (kept quiet) handled as the
// hardware does: the storage of DType::bf16 and DType::f16 as every backend
// reads and writes it (cpu tensors, cuda uploads and downloads).
#pragma once

#include <bit>
#include <cstdint>

namespace meshtrain {

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);  // ties to even; overflow carries into inf
  return static_cast<std::uint16_t>(x >> 16);
}

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u)  // NaN: quiet, keep the top payload bits
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  if (ax < 0x38800000u) {
    // Below 2^-14: the result is subnormal or zero. Adding 0.5 aligns the
    // fp16 subnormal grid with the float mantissa, so the FPU's own
    // round-to-nearest-even does the rounding.
    constexpr std::uint32_t half_bits = 126u << 23;
    const float t = std::bit_cast<float>(ax) + std::bit_cast<float>(half_bits);
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(t) - half_bits));
  }
  const std::uint32_t odd = (ax >> 13) & 1u;
  ax += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round
  return static_cast<std::uint16_t>(sign | (ax >> 13));  // a carry into exponent 31 is inf
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;  // exact
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(v));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace meshtrain
