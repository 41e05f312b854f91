// What the sim backend's source files share and its users do not.
#pragma once

#include <cstdint>

#include "backends/misuse.h"
#include "backends/sim/sim_backend.h"
#include "simulator/event_queue.h"

namespace meshtrain {

// The live and peak bytes of one SimBackend (sim_memory.cc), shared with
// every storage it allocated.
struct SimBackend::Accounting {
  std::int64_t live = 0;  // one host thread issues and frees (backend contract)
  std::int64_t peak = 0;
  std::int64_t host_live = 0;  // host memory (host_zeros), counted apart
  std::int64_t host_peak = 0;
};

namespace sim_internal {

inline constexpr Misuse<"sim"> misuse;

// Simulated picoseconds as the reports' seconds. Dividing by kSecond (not
// sim::to_seconds's multiplication by 1e-12) keeps every reported figure
// bit for bit what it has been.
inline double seconds(sim::Time t) {
  return static_cast<double>(t) / static_cast<double>(sim::kSecond);
}

}  // namespace sim_internal
}  // namespace meshtrain
