// Which ranks a representative simulation drives, and how many ranks each
// stands for (engine/simulation/simulation.h).
//
// Ranks that run the same ops at the same times form a class, and a few
// ranks per class are simulated (backends/sim/sim_cluster.h, "Equivalence
// assumption"). Data-parallel replicas run the same ops; so do the
// tensor-parallel ranks inside a uniform plan, whose collectives are
// symmetric. A uniform plan's classes are therefore its pipeline stages,
// represented by their (tp 0, cp 0, dp 0) rank.
//
// A plan made of segments gives each rank a place in every segment it is in,
// and its boundaries tell ranks apart (segment_boundary.h): only producer
// rank t' mod tp_P sends a piece, its gradient returns from consumer rank
// t mod tp_C, a rank at both ends of a boundary on the same ranks keeps the
// samples both of its replicas hold, and across a boundary between disjoint
// ranks a replica's pieces arrive with the other end's micro-batches that
// hold them (a later replica starts later). Its classes are the ranks with
// the same (stage, tp, cp) in every segment, the same samples kept and the
// same pieces in order at every boundary. The lowest rank of each
// represents it, joined by every rank a chosen one exchanges with point to
// point (the other pipeline stages of its column, the other end of a
// disjoint boundary holding its samples), so that a stage waits for its
// simulated neighbours. A collective with members that are not simulated
// takes its analytic time without waiting for them (tests/sim_backend:
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
  // A plan made of segments, by rank: its pipeline position, the same for ranks holding the same stage of
  // every segment (SimJob::stage_of; a uniform plan's is its stage, SimJob::stages).
  std::vector<int> position_of;
};

RankClasses rank_classes(const Plan& p);

}  // namespace meshtrain
