#include "engine/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "engine/memory/out_of_memory.h"
#include "engine/plan/mesh.h"
#include "engine/planner/candidates.h"
#include "engine/planner/plan_estimate.h"
#include "engine/planner/progress.h"
#include "engine/planner/segment_candidates.h"

namespace meshtrain::planner {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

Error nothing_fits(const SearchContext& ctx, const std::vector<Candidate>& all, double device) {
  const auto closest = std::min_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.memory.peak_bytes < b.memory.peak_bytes;
  });
  const MemoryFit& fit = closest->memory;
  const bool segmented = !closest->plan.segments.empty();
  OutOfMemory o;
  // A plan of segments names its peak rank already; a uniform plan its stage, whose first rank stands for it.
  o.rank = segmented ? fit.peak_stage : Mesh(closest->plan).rank_of({0, 0, 0, fit.peak_stage});
  o.where = segmented ? "" : fmt::format("pipeline stage {}, and every rank of that stage", fit.peak_stage);
  o.peak = fit.peak_bytes;
  o.capacity = device;
  o.consumers = memory_consumers(fit.peak);
  o.detail = fmt::format("{} micro-batches in flight ({} short)", fit.peak.inflight, human_bytes(fit.peak_bytes - device));
  return make_error(
      "no plan of {} on {} GPUs fits {} of device memory ({} valid plans searched). Closest: {}: {}. Use more GPUs, a "
      "device with more memory, a smaller --global-batch or --seq-len, or widen the search (--allow tp=16, --allow "
      "micro_batch=1)",
      ctx.model.name, ctx.gpus, human_bytes(device), all.size(), describe_plan(closest->plan, ctx.model),
      out_of_memory_message(o));
}

// The tiers every candidate goes through, whichever family formed it.

// Tier 1a: the memory model of every candidate, on all cores.
void fit_memory(const ModelSpec& m, std::vector<Candidate>& c, ProgressLine& progress) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c.size(), 64), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) c[i].memory = memory_fit(m, c[i].plan);
    progress.add_done(static_cast<std::int64_t>(r.size()));
    progress.update();
  });
}

// Tier 1b: the fast estimate of the candidates that fit, then their order by it (ties keep enumeration order,
// so one input gives one ranking) and each one's fast_rank.
Status rank_fast(PlanEstimator& fast, std::vector<Candidate>& fits, ProgressLine& progress, const char* references,
                 const char* phase) {
  {
    std::vector<const Plan*> plans;
    for (const Candidate& c : fits) plans.push_back(&c.plan);
    progress.set_phase(references, 0);
    MT_TRY(fast.prepare(plans));
  }
  progress.set_phase(phase, static_cast<std::int64_t>(fits.size()));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, fits.size(), 256), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) fits[i].fast = fast.estimate(fits[i].plan, fits[i].memory);
    progress.add_estimated(static_cast<std::int64_t>(r.size()));
    progress.add_done(static_cast<std::int64_t>(r.size()));
    progress.update();
  });
  std::stable_sort(fits.begin(), fits.end(),
                   [](const Candidate& a, const Candidate& b) { return a.fast.iteration_s < b.fast.iteration_s; });
  for (std::size_t i = 0; i < fits.size(); ++i) fits[i].fast_rank = static_cast<int>(i);
  return ok_status();
}

// Uniform plans: every valid combination, those that fit, ranked by the fast tier.
// `fits` ends in the fast tier's order.
Status search_uniform(const SearchContext& ctx, const SearchSpace& space, PlanEstimator& fast,
                      const SimulateOptions& sim_options, ProgressLine& progress, SearchResult& out,
                      std::vector<Candidate>& fits) {
  auto start = std::chrono::steady_clock::now();
  progress.set_phase("checking", 0);
  Enumeration e = enumerate_candidates(ctx, space, [&](std::int64_t n) {
    progress.set_seen(n);
    progress.update();
  });
  out.combinations = e.combinations;
  out.valid = static_cast<std::int64_t>(e.valid.size());
  progress.set_seen(e.combinations);
  if (e.valid.empty()) {
    const std::string fixed = space.describe_fixed();
    return make_error("no valid plan of {} on {} GPUs with global batch {}{} ({} combinations formed); e.g. {}",
                      ctx.model.name, ctx.gpus, ctx.base.effective_global_batch(),
                      fixed.empty() ? "" : fmt::format(" and --fix {}", fixed), e.combinations,
                      e.example_rejection.value_or("the space is empty"));
  }

  out.enumerate_s = seconds_since(start);

  start = std::chrono::steady_clock::now();
  std::vector<Candidate> all(e.valid.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i].plan = std::move(e.valid[i]);
    all[i].index = static_cast<std::int64_t>(i);
  }
  progress.set_phase("memory", out.valid);
  fit_memory(ctx.model, all, progress);
  const double device = sim_options.cluster.device.memory_bytes;
  // Offload plans whose plan without offload fits, unless --fix/--allow asked for offload.
  std::vector<char> unneeded(all.size(), 0);
  const bool prune_offload = !space.allowed[static_cast<std::size_t>(find_dimension("offload").value() -
                                                                      dimensions().data())];
  if (prune_offload)
    tbb::parallel_for(std::size_t{0}, all.size(), [&](std::size_t i) {
      if (all[i].plan.offload == Offload::none || all[i].memory.peak_bytes > device) return;
      Plan on_device = all[i].plan;
      on_device.offload = Offload::none;
      unneeded[i] = memory_fit(ctx.model, on_device).peak_bytes <= device;
    });
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (unneeded[i]) ++out.offload_unneeded;
    else if (all[i].memory.peak_bytes <= device) fits.push_back(all[i]);
  }
  out.pruned = out.valid - out.offload_unneeded - static_cast<std::int64_t>(fits.size());
  progress.add_pruned(out.pruned);
  out.memory_s = seconds_since(start);
  if (fits.empty()) return nothing_fits(ctx, all, device);
  all.clear();

  start = std::chrono::steady_clock::now();
  MT_TRY(rank_fast(fast, fits, progress, "reference simulations", "fast tier"));
  out.reference_simulations = static_cast<std::int64_t>(fast.reference_simulations());
  out.fast_s = seconds_since(start);
  return ok_status();
}

// Segment layouts: the family, its memory, its fast estimate, and the fast tier's best that the full tier will
// time (`chosen`; their index follows every uniform candidate's, so a tie goes to the uniform plan).
Status search_segments(const SearchContext& ctx, const SegmentSpace& space, std::optional<bool> fp8_params,
                       PlanEstimator& fast,
                       const SimulateOptions& sim_options, const PlannerOptions& options, ProgressLine& progress,
                       SearchResult& out, std::vector<Candidate>& chosen, std::vector<Candidate>& rest) {
  progress.set_phase("segment layouts", 0);
  const double device = sim_options.cluster.device.memory_bytes;
  SegmentEnumeration e = enumerate_segment_candidates(ctx, space, device, fp8_params);
  out.segment_combinations = e.combinations;
  out.segment_valid = static_cast<std::int64_t>(e.valid.size()) + e.pruned;
  out.segment_pruned = e.pruned;
  const bool required = !options.uniform || !space.empty();  // the user asked for segment layouts
  if (e.valid.empty() && e.closest) {
    if (!required) return ok_status();
    Candidate c;
    c.plan = std::move(e.closest->plan);
    c.memory = memory_fit(ctx.model, c.plan);
    return nothing_fits(ctx, {c}, device);
  }
  if (e.valid.empty()) {
    if (!required) return ok_status();
    const std::string pins = space.describe();
    return make_error("no valid segment layout of {} on {} GPUs with global batch {}{} ({} formed){}", ctx.model.name,
                      ctx.gpus, ctx.base.effective_global_batch(),
                      pins.empty() ? "" : fmt::format(" and the segment pins {}", pins), e.combinations,
                      e.example_rejection ? "; e.g. " + *e.example_rejection
                      : e.combinations > 0 ? std::string()
                                           : std::string("; the model has no modules to place apart, or the pins "
                                                         "leave no layout to form"));
  }
  std::vector<Candidate> fits(e.valid.size());
  for (std::size_t i = 0; i < fits.size(); ++i) {
    fits[i].plan = std::move(e.valid[i].plan);
    fits[i].segments = std::move(e.valid[i].segments);
    fits[i].index = out.valid + static_cast<std::int64_t>(i);
  }
  progress.set_phase("segment memory", static_cast<std::int64_t>(fits.size()));
  fit_memory(ctx.model, fits, progress);
  // The fast tier over every layout that fits; the full tier times its best.
  MT_TRY(rank_fast(fast, fits, progress, "segment references", "segment fast tier"));
  const std::size_t n = std::min(fits.size(), static_cast<std::size_t>(std::max(0, options.segments)));
  chosen.assign(std::make_move_iterator(fits.begin()), std::make_move_iterator(fits.begin() + static_cast<std::ptrdiff_t>(n)));
  rest.assign(std::make_move_iterator(fits.begin() + static_cast<std::ptrdiff_t>(n)),
              std::make_move_iterator(fits.end()));
  return ok_status();
}

}  // namespace

Result<SearchResult> search(const SearchContext& ctx, const SearchSpace& space, const SimulateOptions& sim_options,
                            const PlannerOptions& options, const SegmentSpace& segment_space) {
  SearchResult out;
  ProgressLine progress(options.progress);
  // One estimator for both families: the segment layouts reuse the uniform plans' references.
  PlanEstimator fast(ctx, sim_options);
  std::vector<Candidate> fits;  // uniform plans that fit, in the fast tier's order
  if (options.uniform) MT_TRY(search_uniform(ctx, space, fast, sim_options, progress, out, fits));

  auto start = std::chrono::steady_clock::now();
  std::vector<Candidate> segment_layouts, segment_rest;  // the full tier's, and the rest in the fast tier's order
  if (options.segments > 0) {
    // A uniform pin of the whole-plan switch fp8_param_gather binds the segment layouts too.
    std::optional<bool> fp8_params;
    if (const std::optional<int> pin = space.pinned("fp8_param_gather")) fp8_params = *pin != 0;
    MT_TRY(search_segments(ctx, segment_space, fp8_params, fast, sim_options, options, progress, out, segment_layouts,
                           segment_rest));
  }
  out.segments_s = seconds_since(start);

  // Tier 2: the full simulation of the fast tier's best and of the segment layouts.
  start = std::chrono::steady_clock::now();
  const std::size_t n_full = std::min(fits.size(), static_cast<std::size_t>(std::max(0, options.simulate)));
  std::vector<Candidate> head(std::make_move_iterator(fits.begin()),
                              std::make_move_iterator(fits.begin() + static_cast<std::ptrdiff_t>(n_full)));
  out.simulated = static_cast<std::int64_t>(n_full);
  out.segment_simulated = static_cast<std::int64_t>(segment_layouts.size());
  for (Candidate& c : segment_layouts) head.push_back(std::move(c));
  progress.set_phase("full simulation", static_cast<std::int64_t>(head.size()));
  tbb::parallel_for(std::size_t{0}, head.size(), std::size_t{1}, [&](std::size_t i) {
    auto r = simulate_iteration(ctx.model, head[i].plan, sim_options);
    if (r) {
      progress.offer_best(r->iteration_s);
      head[i].sim = std::move(r).value();
    } else {
      head[i].sim_error = r.error().message();
    }
    progress.add_simulated(1);
    progress.add_done(1);
    progress.update();
  });
  out.full_s = seconds_since(start);
  progress.finish();

  std::stable_sort(head.begin(), head.end(), [](const Candidate& x, const Candidate& y) {
    if (x.sim.has_value() != y.sim.has_value()) return x.sim.has_value();
    if (!x.sim || x.sim->iteration_s == y.sim->iteration_s) return x.index < y.index;
    return x.sim->iteration_s < y.sim->iteration_s;
  });
  out.ranked = std::move(head);
  // Then the rest of both kinds by the fast estimate (a tie to the uniform plan).
  const std::size_t first_rest = out.ranked.size();
  for (std::size_t i = n_full; i < fits.size(); ++i) out.ranked.push_back(std::move(fits[i]));
  for (Candidate& c : segment_rest) out.ranked.push_back(std::move(c));
  std::stable_sort(out.ranked.begin() + static_cast<std::ptrdiff_t>(first_rest), out.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return a.fast.iteration_s < b.fast.iteration_s; });
  return out;
}

}  // namespace meshtrain::planner
