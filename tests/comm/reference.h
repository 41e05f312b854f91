// Inputs and single-threaded reference results shared by the communicator
// tests: the in-process test checks the threads against these, and the MPI test
// checks MPI against the threads.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/backend.h"

namespace meshtrain::testing {

inline constexpr std::uint64_t kSeed = 20240601;

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of rank r's contribution. Magnitudes cycle through 1e8, 1 and -1e8
// (with a little noise) so that fp32 sums differ by summation order: 1e8 + 1
// rounds back to 1e8, but 1e8 - 1e8 + 1 is 1.
inline float contribution(int rank, std::size_t i, std::uint64_t salt = 0) {
  std::uint64_t h = splitmix(kSeed ^ (salt * 1000003u) ^ (static_cast<std::uint64_t>(rank) << 40) ^ i);
  float noise = static_cast<float>(h % 1024) / 1024.0f;  // [0, 1)
  switch ((static_cast<std::size_t>(rank) + i) % 3) {
    case 0: return 1e8f * (1.0f + noise * 0.001f);
    case 1: return 1.0f + noise;
    default: return -1e8f * (1.0f + noise * 0.001f);
  }
}

inline std::vector<float> contributions(int rank, std::size_t n, std::uint64_t salt = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = contribution(rank, i, salt);
  return v;
}

// Folds inputs[members[0]], inputs[members[1]], ... element by element, in
// the order given.
inline std::vector<float> fold(const std::vector<std::vector<float>>& inputs,
                               const std::vector<int>& members, ReduceOp op) {
  std::vector<float> acc = inputs[static_cast<std::size_t>(members[0])];
  for (std::size_t m = 1; m < members.size(); ++m) {
    const auto& x = inputs[static_cast<std::size_t>(members[m])];
    for (std::size_t i = 0; i < acc.size(); ++i) {
      if (op == ReduceOp::sum) acc[i] = acc[i] + x[i];
      else if (x[i] > acc[i]) acc[i] = x[i];
    }
  }
  return acc;
}

// "" when a and b hold the same bits, else where they first differ.
inline std::string bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return fmt::format("sizes {} and {}", a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]))
      return fmt::format("element {}: {} vs {}", i, a[i], b[i]);
  return "";
}

}  // namespace meshtrain::testing
