// Candidate plans: every combination of the search space's dimension values
// (search_space.h) that validate_plan and the step engine accept.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/plan/plan.h"
#include "engine/planner/search_space.h"

namespace meshtrain::planner {

struct Enumeration {
  std::vector<Plan> valid;     // in enumeration order (the table's rows, values ascending)
  std::int64_t combinations = 0;  // every combination formed, valid or not
  // For a search that finds nothing valid: one rejected combination and why.
  std::optional<std::string> example_rejection;
};

// Forms every combination (table order, so a row's defaults see the rows
// before it) and keeps those validate_plan (against ctx.gpus) and
// StepEngine::supports accept; the checks run on all cores. `on_progress`,
// when given, is called with the number checked so far (from any thread).
Enumeration enumerate_candidates(const SearchContext& ctx, const SearchSpace& space,
                                 const std::function<void(std::int64_t)>& on_progress = {});

// "tp 8 pp 4 dp 32 vpp 3 mb 2 zero 1 recompute full sp" : a plan in one short line.
std::string describe_plan(const Plan& p, const ModelSpec& m);

}  // namespace meshtrain::planner
