// Which ranks a representative simulation drives, and how many ranks each
// stands for (engine/simulation/simulation.h).
//
// Ranks that run the same ops on the same sizes form a class, and one rank
// per class is simulated (backends/sim/sim_cluster.h, "Equivalence
// assumption"). Data-parallel replicas run the same ops; so do the
// tensor-parallel ranks inside a uniform plan, whose collectives are
// symmetric. A uniform plan's classes are therefore its pipeline stages,
// represented by their (tp 0, cp 0, dp 0) rank.
//
// A plan made of segments gives each rank a place in every segment it is in,
// and the boundaries between segments treat tensor-parallel ranks unequally
// (segment_boundary.h: only producer rank t' mod tp_P sends a piece, and its
// gradient returns from consumer rank t mod tp_C), and a rank at both ends of
// a boundary keeps the samples both of its replicas hold instead of sending
// them. Its classes are the ranks with the same (pipeline stage, tp index,
// cp index) in every segment and the same samples kept at every boundary,
// and the lowest rank of each represents it, joined by every rank a chosen
// one waits for (the other pipeline stages of its column in every segment,
// the peers it receives from across a boundary between disjoint ranks), so
// that a stage waits for its simulated neighbours. A send to or from a rank that is not
// simulated takes its analytic time without waiting for that rank, as a
// uniform plan's collectives with unsimulated members do (tests/sim_backend:
// representative and full fidelity agree). A few ranks per class keep a
// segmented plan on 1024 GPUs about as cheap to simulate as a uniform one.
#pragma once

#include <vector>

#include "engine/plan/plan.h"

namespace meshtrain {

struct RankClasses {
  // Uniform plans: by pipeline stage; segmented plans: ascending.
  std::vector<int> representatives;
  // By representative: the ranks it stands for, itself included (a class
  // with several representatives splits its ranks among them).
  std::vector<int> stands_for;
  int classes = 0;
  std::vector<int> class_of;  // by rank: its class, 0 .. classes - 1
};

RankClasses rank_classes(const Plan& p);

}  // namespace meshtrain
