// Programming errors in the use of the cuda backend abort with a message
// (backends/misuse.h).
#pragma once

#include <fmt/format.h>

#include "backends/misuse.h"

namespace meshtrain::cuda {

template <class... Args>
[[noreturn]] void misuse(fmt::format_string<Args...> f, Args&&... args) {
  abort_misuse("cuda", fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace meshtrain::cuda
