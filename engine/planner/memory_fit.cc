#include "engine/planner/memory_fit.h"

#include <map>
#include <vector>

#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "models/model_io.h"

namespace meshtrain::planner {

namespace {

bool layers_alike(const ModelSpec& m) { return model_io(m).layers_alike; }

}  // namespace

MemoryFit memory_fit(const ModelSpec& m, const Plan& p) {
  MemoryFit fit;
  if (!p.segments.empty()) {
    // A rank holds a stage of each segment it is in: ranks holding the same
    // stages hold the same memory, so each such set is evaluated once.
    std::vector<Mesh> meshes;
    for (const Plan& s : p.segments) meshes.emplace_back(s);
    std::map<std::vector<int>, MemoryBreakdown> seen;
    for (int rank = 0; rank < p.world_size(); ++rank) {
      std::vector<int> stages;
      for (std::size_t k = 0; k < p.segments.size(); ++k) {
        const Plan& s = p.segments[k];
        const bool in = rank >= s.first_rank && rank < s.first_rank + s.world_size();
        stages.push_back(in ? meshes[k].coord_of(rank).pp : -1);
      }
      auto it = seen.find(stages);
      if (it == seen.end()) it = seen.emplace(stages, rank_memory(m, p, rank)).first;
      const MemoryBreakdown& b = it->second;
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
