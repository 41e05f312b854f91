// Programming errors in the use of a backend abort with a message
// (backends/backend.h: misuse is not an Error value). Each backend has a
// misuse() of its own that names it (cpu/misuse.h, cuda/misuse.h,
// sim/sim_internal.h) and ends here, so that all of them print alike.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace meshtrain {

// Prints "meshtrain: <backend> backend misuse: <message>" and aborts.
[[noreturn]] inline void abort_misuse(std::string_view backend, const std::string& message) {
  std::fprintf(stderr, "meshtrain: %.*s backend misuse: %s\n", static_cast<int>(backend.size()),
               backend.data(), message.c_str());
  std::abort();
}

// Whether backend op `op` takes a tensor in host memory (Backend::host_zeros):
// the backends' tensor checks ask this with the op's name. write and read,
// and the ops the op table (backends/op_table.h) marks host_memory.
bool takes_host_memory(std::string_view op);

}  // namespace meshtrain
