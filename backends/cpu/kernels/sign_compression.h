// 1-bit sign compression with error feedback (Backend::sign_compress and
// sign_decompress). Legend: C chunks, k elements per chunk, W = ceil(k/32)
// sign words per chunk; a packet row is 1 + W words (the scale's bits, then
// the signs). Chunks are independent and each chunk's sum runs in double in
// element order, so the bits do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

inline std::int64_t sign_words(std::int64_t k) { return (k + 31) / 32; }

// packets (C, 1 + W); error (C, k) or null (no error feedback), updated in place.
inline void sign_compress(std::int64_t C, std::int64_t k, const float* x, float* error, std::int32_t* packets) {
  const std::int64_t W = sign_words(k);
  for_rows(C, k, [&](std::int64_t c) {
    const float* xc = x + c * k;
    float* ec = error != nullptr ? error + c * k : nullptr;
    auto y = [&](std::int64_t i) { return ec != nullptr ? xc[i] + ec[i] : xc[i]; };
    double sum = 0;
    for (std::int64_t i = 0; i < k; ++i) sum += std::fabs(static_cast<double>(y(i)));
    const float scale = k > 0 ? static_cast<float>(sum / static_cast<double>(k)) : 0.f;
    std::int32_t* row = packets + c * (1 + W);
    std::memcpy(row, &scale, sizeof scale);
    for (std::int64_t w = 0; w < W; ++w) {
      std::uint32_t bits = 0;
      const std::int64_t end = std::min(k, (w + 1) * 32);
      for (std::int64_t i = w * 32; i < end; ++i) {
        const float v = y(i);
        const bool positive = v >= 0.f;
        bits |= static_cast<std::uint32_t>(positive) << (i - w * 32);
        if (ec != nullptr) ec[i] = v - (positive ? scale : -scale);
      }
      row[1 + w] = static_cast<std::int32_t>(bits);
    }
  });
}

// out (C, k) = ± the row's scale, by each element's sign bit.
inline void sign_decompress(std::int64_t C, std::int64_t k, const std::int32_t* packets, float* out) {
  const std::int64_t W = sign_words(k);
  for_rows(C, k, [&](std::int64_t c) {
    const std::int32_t* row = packets + c * (1 + W);
    float scale;
    std::memcpy(&scale, row, sizeof scale);
    float* oc = out + c * k;
    for (std::int64_t i = 0; i < k; ++i) {
      const auto bits = static_cast<std::uint32_t>(row[1 + i / 32]);
      oc[i] = (bits >> (i % 32)) & 1u ? scale : -scale;
    }
  });
}

}  // namespace meshtrain::cpu
