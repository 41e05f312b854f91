#include "simulator/host_sharing.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::sim {

namespace {
// Threads per rank thread, as the cpu backend divides the cores (backends/cpu/threads.cc).
double threads_for(double cores, int ranks) { return std::max(1.0, std::floor(cores / std::max(1, ranks))); }
double share(double cores, double ranks, double threads) { return std::min(1.0, cores / (ranks * threads)); }
}  // namespace

double HostSharing::speed(double computing) const {
  if (!on()) return 1.0;
  return share(cores, std::max(1.0, computing), threads_per_rank) / calibrated_share;
}

HostSharing host_sharing_for(const Calibration& picked, int ranks) {
  HostSharing h;
  if (picked.machine.backend != "cpu" || picked.machine.cores <= 0) return h;
  const std::vector<int> levels = picked.sharing_levels();
  // The level for_ranks_sharing kept: the largest <= ranks, else the smallest.
  int level = levels.front();
  for (int l : levels)
    if (l <= ranks) level = l;
  h.cores = picked.machine.cores;
  h.threads_per_rank = threads_for(h.cores, ranks);
  h.calibrated_share = share(h.cores, level, threads_for(h.cores, level));
  return h;
}

}  // namespace meshtrain::sim
