// How the cpu backend shares a machine's cores among the rank threads of one
// process: the one rule that backends/cpu/threads.cc applies when it sizes a
// rank's thread pool and that the simulator assumes when it times rank
// threads from a cpu calibration (simulator/host_sharing.h), so that both
// divide the same cores the same way.
#pragma once

#include <algorithm>

namespace meshtrain {

// Threads for each of `ranks` rank threads sharing `cores`: cores / ranks, at least 1.
inline int rank_thread_share(int cores, int ranks) { return std::max(1, cores / std::max(1, ranks)); }

}  // namespace meshtrain
