// `meshtrain plan`'s search, one pipeline for both families of candidates:
// enumerate uniform plans (candidates.h) and segment layouts
// (segment_candidates.h), prune both by the memory model (memory_fit.h),
// rank the rest with one fast tier (plan_estimate.h), re-time the best of
// each family with the full discrete-event simulation
// (engine/simulation/simulation.h), whose order is final. Every tier runs on
// all cores (oneTBB).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/planner/fast_estimate.h"
#include "engine/planner/memory_fit.h"
#include "engine/planner/search_space.h"
#include "engine/planner/segment_space.h"
#include "engine/simulation/simulation.h"

namespace meshtrain::planner {

struct PlannerOptions {
  int simulate = 32;      // candidates the full tier re-times (the fast tier's best)
  bool progress = false;  // draw the progress line on stderr
  bool uniform = true;    // search uniform plans (search_space.h)
  // Segment layouts (segment_candidates.h) the full tier times: the fast
  // tier's best (plan_estimate.h) of the whole family. 0: none searched.
  int segments = 16;
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
  // The place (0-based) in the fast tier's order, for the candidates both tiers timed; -1 otherwise.
  int fast_rank = -1;
  // A segment layout's plan-file "segments" list (null for a uniform plan).
  nlohmann::json segments;
};

struct SearchResult {
  std::int64_t combinations = 0, valid = 0, pruned = 0, simulated = 0, reference_simulations = 0;
  // Valid offload plans left out because the same plan without offload fits:
  // offload only adds PCIe copies and the host's AdamW to a step (the DES
  // and the fast tier agree), so it is searched where it is what makes a
  // plan fit (search_space.h). Neither pruned nor estimated. Only under
  // offload's defaults: --fix or --allow offload=... keeps every plan listed.
  std::int64_t offload_unneeded = 0;
  double enumerate_s = 0, memory_s = 0, fast_s = 0, full_s = 0;  // wall time of each tier
  // Segment layouts: formed, valid, pruned (over the device, or a memory saving not needed), timed by the full tier.
  std::int64_t segment_combinations = 0, segment_valid = 0, segment_pruned = 0, segment_simulated = 0;
  double segments_s = 0;  // wall time of the segment layouts before the full tier (enumeration, memory, fast tier)
  // The full tier's candidates, uniform and segment layouts, fastest first by
  // the DES (those it refused last), then every other fitting candidate of
  // both kinds by the fast estimate.
  std::vector<Candidate> ranked;
};

// An Error when nothing is valid (one rejected combination and why, with the
// pinned dimensions) or nothing fits the device (the closest candidate, its
// stage and memory, and by how much it is short).
// `segment_space` pins and narrows the segment layouts (segment_space.h).
Result<SearchResult> search(const SearchContext& ctx, const SearchSpace& space, const SimulateOptions& sim_options,
                            const PlannerOptions& options, const SegmentSpace& segment_space = {});

}  // namespace meshtrain::planner
