#include "engine/planner/memory_fit.h"

#include "engine/segments/segment_plan.h"

namespace meshtrain::planner {

namespace {

bool layers_alike(const ModelSpec& m) {
  if (m.vision()) return false;
  for (int l = 1; l < m.layers; ++l)
    if (m.moe_layer(l) != m.moe_layer(0)) return false;
  return true;
}

}  // namespace

MemoryFit memory_fit(const ModelSpec& m, const Plan& p) {
  MemoryFit fit;
  if (!p.segments.empty()) {
    // Ranks of one segment differ in what the others give them: every rank.
    for (int rank = 0; rank < p.world_size(); ++rank) {
      const MemoryBreakdown b = rank_memory(m, p, rank);
      fit.max_stage_parameters = std::max(fit.max_stage_parameters, b.parameter_count);
      if (b.total() > fit.peak_bytes || rank == 0) fit.peak_bytes = b.total(), fit.peak_stage = rank, fit.peak = b;
    }
    return fit;
  }
  const ActivationLayout layout = meshtrain_layout(p);
  const bool shortcut = layers_alike(m) && p.pp > 3;
  auto visit = [&](int stage) {
    MemoryBreakdown b = memory_per_rank(m, p, stage, layout);
    fit.max_stage_parameters = std::max(fit.max_stage_parameters, b.parameter_count);
    if (b.total() > fit.peak_bytes || stage == 0) {
      fit.peak_bytes = b.total();
      fit.peak_stage = stage;
      fit.peak = b;
    }
  };
  if (shortcut) {
    // With an even first stage, stage 0 holds what stage 1 does plus the
    // embedding, with at least as many micro-batches in flight.
    visit(0);
    if (p.first_stage_layers != 0) visit(1);
    visit(p.pp - 1);
  } else {
    for (int stage = 0; stage < p.pp; ++stage) visit(stage);
  }
  return fit;
}

}  // namespace meshtrain::planner
