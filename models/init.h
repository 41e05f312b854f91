// Seeded, counter-based initialisation: element i of a parameter is a pure
// function of (seed, parameter name, i), so a tensor-parallel shard draws
// exactly the values the whole tensor has at those positions, on any backend
// and in any order, without materialising the whole tensor.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace meshtrain {

inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::uint64_t hash_name(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// A standard normal draw for counter i of stream `key` (Box–Muller on two
// 53-bit uniforms; the cosine branch only, so each counter is independent).
inline double normal_at(std::uint64_t key, std::uint64_t i) {
  const std::uint64_t a = mix64(key ^ mix64(2 * i)), b = mix64(key ^ mix64(2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace meshtrain
