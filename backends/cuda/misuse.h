// Programming errors in the use of the cuda backend abort with a message
// (backends/backend.h: misuse is not an Error value).
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace meshtrain::cuda {

template <class... Args>
[[noreturn]] void misuse(fmt::format_string<Args...> f, Args&&... args) {
  std::fprintf(stderr, "meshtrain: cuda backend misuse: %s\n",
               fmt::format(f, std::forward<Args>(args)...).c_str());
  std::abort();
}

}  // namespace meshtrain::cuda
