#include "engine/planner/candidates.h"

#include <atomic>
#include <mutex>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "engine/planner/segment_candidates.h"
#include "engine/step/step_engine.h"
#include "models/model_io.h"

namespace meshtrain::planner {

namespace {

void walk(const SearchContext& ctx, const SearchSpace& space, std::size_t dim, Plan& partial, std::vector<Plan>& out) {
  const std::vector<Dimension>& dims = dimensions();
  if (dim == dims.size()) {
    out.push_back(partial);
    return;
  }
  for (int v : space.values(dim, ctx, partial)) {
    dims[dim].apply(partial, v);
    walk(ctx, space, dim + 1, partial, out);
  }
  dims[dim].apply(partial, dims[dim].get(ctx.base));
}

}  // namespace

Enumeration enumerate_candidates(const SearchContext& ctx, const SearchSpace& space,
                                 const std::function<void(std::int64_t)>& on_progress) {
  std::vector<Plan> all;
  Plan partial = ctx.base;
  walk(ctx, space, 0, partial, all);
  Enumeration e;
  e.combinations = static_cast<std::int64_t>(all.size());
  std::vector<char> ok(all.size(), 0);
  std::atomic<std::int64_t> checked{0};
  std::mutex rejection_mutex;  // guards e.example_rejection
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, all.size(), 256), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) {
      Status s = validate_plan(all[i], ctx.model, ctx.gpus);
      if (s) s = StepEngine::supports(all[i], ctx.step);
      ok[i] = s.ok() ? 1 : 0;
      if (!s) {
        std::lock_guard lock(rejection_mutex);
        if (!e.example_rejection)
          e.example_rejection = fmt::format("{}: {}", describe_plan(all[i], ctx.model), s.error().message());
      }
    }
    const std::int64_t n = checked += static_cast<std::int64_t>(r.size());
    if (on_progress) on_progress(n);
  });
  for (std::size_t i = 0; i < all.size(); ++i)
    if (ok[i]) e.valid.push_back(std::move(all[i]));
  return e;
}

std::string describe_plan(const Plan& p, const ModelSpec& m) {
  if (!p.segments.empty()) return describe_segments_short(p);
  std::string s = fmt::format("tp {} pp {} dp {}", p.tp, p.pp, p.dp);
  if (p.cp > 1) s += fmt::format(" cp {}{}", p.cp, p.cp_comm == ContextComm::ring ? " ring" : "");
  if (p.vpp > 1) s += fmt::format(" vpp {}", p.vpp);
  if (p.schedule == ScheduleKind::gpipe) s += " gpipe";
  s += fmt::format(" mb {}", p.micro_batch);
  if (p.zero > 0) s += fmt::format(" zero {}", p.zero);
  if (p.zero_reduce_once) s += " reduce-once";
  if (p.zero == 3 && !p.prefetch_across_chunks) s += " no-prefetch-across";
  if (p.recompute != Recompute::none || p.recompute_modules.any()) s += fmt::format(" rc {}", recompute_label(p));
  if (p.sequence_parallel) s += " sp";
  if (model_io(m).routes_to_experts) s += fmt::format(" ep {}", p.ep) + (p.etp == 1 && p.tp > 1 ? " etp 1" : "");
  if (p.moe_a2a_overlap) s += " a2a-overlap";
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0)
    s += fmt::format(" ends {}/{}", p.first_stage_layers, p.last_stage_layers);
  if (p.grad_compression != GradCompression::none) s += " gc " + grad_compression_name(p.grad_compression);
  if (p.offload != Offload::none) s += " offload " + offload_name(p.offload);
  if (p.overlap_update) s += " ou";
  if (p.fp8_param_gather) s += " fp8-params";
  if (p.overlap_p2p_comm) s += " p2p-overlap";
  return s;
}

}  // namespace meshtrain::planner
