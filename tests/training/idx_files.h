// IDX files (the MNIST format) as bytes, for tests that write image sets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::testing {

// An IDX file's bytes: big-endian magic and sizes, then the payload.
inline std::string idx_bytes(std::uint32_t magic, std::vector<std::uint32_t> dims, const std::string& payload) {
  std::string out;
  auto put = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put(magic);
  for (std::uint32_t d : dims) put(d);
  return out + payload;
}

}  // namespace meshtrain::testing
