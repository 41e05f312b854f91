// Programming errors in the use of a backend abort with a message
// (backends/backend.h: misuse is not an Error value). Each backend has a
// misuse() of its own that names it (cpu/misuse.h, cuda/misuse.h,
// sim/sim_internal.h), a Misuse below, so that all of them print alike.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

namespace meshtrain {

// Prints "meshtrain: <backend> backend misuse: <message>" and aborts.
[[noreturn]] inline void abort_misuse(std::string_view backend, const std::string& message) {
  std::fprintf(stderr, "meshtrain: %.*s backend misuse: %s\n", static_cast<int>(backend.size()),
               backend.data(), message.c_str());
  std::abort();
}

// A backend's name as a template argument; implicit, so that Misuse<"cpu"> converts the literal.
template <std::size_t N>
struct BackendName {
  constexpr BackendName(const char (&name)[N]) { std::copy_n(name, N, chars); }
  char chars[N];
};

// The misuse() of backend Name: misuse("format", args...) formats as fmt::format
// and aborts through abort_misuse.
template <BackendName Name>
struct Misuse {
  template <class... Args>
  [[noreturn]] void operator()(fmt::format_string<Args...> f, Args&&... args) const {
    abort_misuse(Name.chars, fmt::format(f, std::forward<Args>(args)...));
  }
};

// Whether backend op `op` takes a tensor in host memory (Backend::host_zeros):
// the backends' tensor checks ask this with the op's name. write and read,
// and the ops the op table (backends/op_table.h) marks host_memory.
bool takes_host_memory(std::string_view op);

}  // namespace meshtrain
