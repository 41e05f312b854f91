// `meshtrain plan`'s search: enumerate the space (candidates.h), prune by
// the memory model (memory_fit.h), rank the rest with the fast tier
// (fast_estimate.h), re-time the best with the full discrete-event
// simulation (engine/simulation.h), whose order is final. Every tier runs
// on all cores (oneTBB).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/planner/fast_estimate.h"
#include "engine/planner/memory_fit.h"
#include "engine/planner/search_space.h"
#include "engine/simulation.h"

namespace meshtrain::planner {

struct PlannerOptions {
  int simulate = 32;      // candidates the full tier re-times (the fast tier's best)
  bool progress = false;  // draw the progress line on stderr
};

struct Candidate {
  Plan plan;
  // Place in the enumeration: among equal times the earlier (simpler: the
  // table's defaults list the plain values first) ranks first.
  std::int64_t index = 0;
  MemoryFit memory;
  FastBreakdown fast;
  std::optional<SimulationResult> sim;  // the full tier's, when it ran and succeeded
  std::string sim_error;               // why the full tier refused it (e.g. the DES's out of memory)
};

struct SearchResult {
  std::int64_t combinations = 0, valid = 0, pruned = 0, simulated = 0, reference_simulations = 0;
  double enumerate_s = 0, memory_s = 0, fast_s = 0, full_s = 0;  // wall time of each tier
  // The full tier's candidates, fastest first by the DES (those it refused
  // last), then every other fitting candidate by the fast estimate.
  std::vector<Candidate> ranked;
  // Each simulated candidate's place (0-based) in the fast tier's order, as ranked.
  std::vector<int> fast_rank;
};

// An Error when nothing is valid (one rejected combination and why, with the
// pinned dimensions) or nothing fits the device (the closest candidate, its
// stage and memory, and by how much it is short).
Result<SearchResult> search(const SearchContext& ctx, const SearchSpace& space, const SimulateOptions& sim_options,
                            const PlannerOptions& options);

}  // namespace meshtrain::planner
