// What every fuzz target does first: take libFuzzer's bytes as the text a
// reader parses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshtrain::fuzz {

inline std::string_view fuzz_text(const std::uint8_t* data, std::size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace meshtrain::fuzz
