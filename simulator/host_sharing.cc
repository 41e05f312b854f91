#include "simulator/host_sharing.h"

#include <algorithm>

#include "core/thread_share.h"

namespace meshtrain::sim {

namespace {
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
  h.threads_per_rank = rank_thread_share(picked.machine.cores, ranks);
  h.calibrated_share = share(h.cores, level, rank_thread_share(picked.machine.cores, level));
  return h;
}

}  // namespace meshtrain::sim
