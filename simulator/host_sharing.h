// Rank threads that share one machine's cores (the cpu backend, ranks as
// threads): how fast a rank's kernels run depends on how many ranks compute
// at that moment.
//
// A calibration measured k rank threads running the same kernel at once
// (Calibration::for_ranks_sharing picks level L for a plan), each rank thread
// using max(1, cores / k) threads, as `meshtrain train` divides them. That
// holds while every rank of the plan computes; a pipeline's idle stages, or
// a rank waiting in a collective, leave their cores to the others. The
// executor therefore runs each compute task at
//
//     speed = share(k_now) / share(L),  share(k) = min(1, cores / (k · t))
//
// (processor sharing), where k_now is how many ranks compute now and t the
// plan's threads per rank. GPUs share nothing: `cores` 0 turns it off.
#pragma once

#include "simulator/calibration.h"

namespace meshtrain::sim {

struct HostSharing {
  double cores = 0;             // the machine's cores; 0: devices share no processor
  double threads_per_rank = 1;  // t: the plan's threads per rank thread
  double calibrated_share = 1;  // share(L): a core's fraction each thread had when measured

  bool on() const { return cores > 0; }
  // Speed of a compute task while ranks worth `computing` run compute (>= 1).
  double speed(double computing) const;
};

// The sharing of `ranks` rank threads on the machine `picked` was measured on
// (picked: after for_ranks_sharing(ranks)); off unless it is a cpu-backend
// calibration that records its cores.
HostSharing host_sharing_for(const Calibration& picked, int ranks);

}  // namespace meshtrain::sim
