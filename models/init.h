// Seeded, counter-based initialisation: element i of a parameter is a pure
// function of (seed, parameter name, i), so a tensor-parallel shard draws
// exactly the values the whole tensor has at those positions, on any backend
// and in any order, without materialising the whole tensor.
#pragma once

#include <cstdint>
#include <string_view>

#include "backends/counter_rng.h"  // mix64, normal_at

namespace meshtrain {

inline std::uint64_t hash_name(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace meshtrain
