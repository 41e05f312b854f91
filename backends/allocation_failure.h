// How a backend says that an allocation failed, in one place, so that the
// engine can recognise the failure among a step's errors and add what the
// memory model knows (the rank's estimated peak and its largest consumer)
// without matching each backend's wording.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/status.h"

namespace meshtrain {

// "out of <memory> memory: cannot allocate <bytes> bytes for <what>"; the
// backend appends what it knows (bytes held, the allocator's state, a fix).
inline std::string allocation_failure_message(std::string_view memory, std::size_t bytes, std::string_view what) {
  return fmt::format("out of {} memory: cannot allocate {} bytes for {}", memory, bytes, what);
}

// Whether `e` (with any context prepended) is a backend's allocation failure.
inline bool is_allocation_failure(const Error& e) {
  return e.message().find(" memory: cannot allocate ") != std::string::npos;
}

}  // namespace meshtrain
