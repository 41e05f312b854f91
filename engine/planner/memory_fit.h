// A candidate's memory by the analytic memory model (engine/memory/memory_model.h):
// the planner's first tier prunes every plan whose most loaded rank does not
// fit the device.
#pragma once

#include <cstdint>

#include "engine/memory/memory_model.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"

namespace meshtrain::planner {

struct MemoryFit {
  double peak_bytes = 0;  // the most any pipeline stage's rank holds
  int peak_stage = 0;     // for a plan made of segments: the rank
  MemoryBreakdown peak;   // that stage's breakdown
  // Parameters of the stage holding the most (its optimizer step and gradient reduction bound the iteration).
  std::int64_t max_stage_parameters = 0;
  std::int64_t max_stage_expert_parameters = 0;  // of which routed experts'
};

// The maximum over pipeline stages of memory_per_rank(meshtrain_layout). When
// every body layer is alike (a decoder whose layers are all dense or all
// MoE), only stages 0, 1 and pp-1 are evaluated: the middle stages hold the
// same layers and parameters and stage 1 has the most micro-batches in
// flight of them in every schedule; with an even first stage, stage 0 holds
// all stage 1 does and more, so stage 1 is skipped too (the test checks this
// against all stages). A plan made of segments: the maximum over its ranks of
// rank_memory (engine/plan/segment_plan.h).
MemoryFit memory_fit(const ModelSpec& m, const Plan& p);

}  // namespace meshtrain::planner
