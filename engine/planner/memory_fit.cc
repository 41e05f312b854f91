#include "engine/planner/memory_fit.h"

#include <map>
#include <vector>

#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "models/model_io.h"

namespace meshtrain::planner {

namespace {

bool layers_alike(const ModelSpec& m) { return model_io(m).layers_alike; }

// The most parameters a stage holds, and that stage's expert share.
void keep_parameters(MemoryFit& fit, const MemoryBreakdown& b) {
  if (b.parameter_count <= fit.max_stage_parameters) return;
  fit.max_stage_parameters = b.parameter_count;
  fit.max_stage_expert_parameters = b.expert_parameter_count;
}

}  // namespace

MemoryFit memory_fit(const ModelSpec& m, const Plan& p) {
  MemoryFit fit;
  if (!p.segments.empty()) {
    // Ranks holding the same stage of every segment hold the same memory,
    // so each such set is evaluated once.
    const std::vector<int> positions = pipeline_positions(p);
    std::map<int, MemoryBreakdown> seen;
    for (int rank = 0; rank < p.world_size(); ++rank) {
      const int at = positions[static_cast<std::size_t>(rank)];
      auto it = seen.find(at);
      if (it == seen.end()) it = seen.emplace(at, rank_memory(m, p, rank)).first;
      const MemoryBreakdown& b = it->second;
      keep_parameters(fit, b);
      if (b.total() > fit.peak_bytes || rank == 0) fit.peak_bytes = b.total(), fit.peak_stage = rank, fit.peak = b;
    }
    return fit;
  }
  const ActivationLayout layout = meshtrain_layout(p);
  const bool shortcut = layers_alike(m) && p.pp > 3;
  auto visit = [&](int stage) {
    MemoryBreakdown b = memory_per_rank(m, p, stage, layout);
    keep_parameters(fit, b);
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
