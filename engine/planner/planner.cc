#include "engine/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "engine/planner/candidates.h"
#include "engine/planner/progress.h"

namespace meshtrain::planner {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

Error nothing_fits(const SearchContext& ctx, const std::vector<Candidate>& all, double device) {
  const auto closest = std::min_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.memory.peak_bytes < b.memory.peak_bytes;
  });
  const MemoryBreakdown& m = closest->memory.peak;
  return make_error(
      "no plan of {} on {} GPUs fits {} of device memory ({} valid plans searched). Closest: {} needs {} on "
      "pipeline stage {} ({} short): parameters {}, gradients {}, optimizer {}, activations {} ({} micro-batches "
      "in flight). Use more GPUs, a device with more memory, a smaller --global-batch or --seq-len, or widen the "
      "search (--allow tp=16, --allow micro_batch=1)",
      ctx.model.name, ctx.gpus, human_bytes(device), all.size(), describe_plan(closest->plan, ctx.model),
      human_bytes(closest->memory.peak_bytes), closest->memory.peak_stage,
      human_bytes(closest->memory.peak_bytes - device), human_bytes(m.parameters), human_bytes(m.gradients),
      human_bytes(m.optimizer), human_bytes(m.activations), m.inflight);
}

}  // namespace

Result<SearchResult> search(const SearchContext& ctx, const SearchSpace& space, const SimulateOptions& sim_options,
                            const PlannerOptions& options) {
  SearchResult out;
  ProgressLine progress(options.progress);

  // Tier 0: every valid combination.
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

  // Tier 1a: the memory model, on all cores.
  start = std::chrono::steady_clock::now();
  std::vector<Candidate> all(e.valid.size());
  progress.set_phase("memory", out.valid);
  const double device = sim_options.cluster.device.memory_bytes;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, all.size(), 64), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) {
      all[i].plan = std::move(e.valid[i]);
      all[i].index = static_cast<std::int64_t>(i);
      all[i].memory = memory_fit(ctx.model, all[i].plan);
    }
    progress.add_done(static_cast<std::int64_t>(r.size()));
    progress.update();
  });
  std::vector<Candidate> fits;
  for (Candidate& c : all)
    if (c.memory.peak_bytes <= device) fits.push_back(c);
  out.pruned = out.valid - static_cast<std::int64_t>(fits.size());
  progress.add_pruned(out.pruned);
  out.memory_s = seconds_since(start);
  if (fits.empty()) return nothing_fits(ctx, all, device);
  all.clear();

  // Tier 1b: the fast estimate.
  start = std::chrono::steady_clock::now();
  FastEstimator fast(ctx, sim_options);
  {
    std::vector<const Plan*> plans;
    for (const Candidate& c : fits) plans.push_back(&c.plan);
    progress.set_phase("reference simulations", 0);
    MT_TRY(fast.prepare(plans));
  }
  out.reference_simulations = static_cast<std::int64_t>(fast.reference_simulations());
  progress.set_phase("fast tier", static_cast<std::int64_t>(fits.size()));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, fits.size(), 256), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) fits[i].fast = fast.estimate(fits[i].plan, fits[i].memory);
    progress.add_estimated(static_cast<std::int64_t>(r.size()));
    progress.add_done(static_cast<std::int64_t>(r.size()));
    progress.update();
  });
  // Ties (equal estimates) keep enumeration order, so one input gives one ranking.
  std::stable_sort(fits.begin(), fits.end(),
                   [](const Candidate& a, const Candidate& b) { return a.fast.iteration_s < b.fast.iteration_s; });
  out.fast_s = seconds_since(start);

  // Tier 2: the full simulation of the fast tier's best.
  start = std::chrono::steady_clock::now();
  const std::size_t n_full = std::min(fits.size(), static_cast<std::size_t>(std::max(0, options.simulate)));
  progress.set_phase("full simulation", static_cast<std::int64_t>(n_full));
  tbb::parallel_for(std::size_t{0}, n_full, std::size_t{1}, [&](std::size_t i) {
    auto r = simulate_iteration(ctx.model, fits[i].plan, sim_options);
    if (r) {
      progress.offer_best(r->iteration_s);
      fits[i].sim = std::move(r).value();
    } else {
      fits[i].sim_error = r.error().message();
    }
    progress.add_simulated(1);
    progress.add_done(1);
    progress.update();
  });
  out.simulated = static_cast<std::int64_t>(n_full);
  out.full_s = seconds_since(start);
  progress.finish();

  std::vector<int> order(n_full);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Candidate &x = fits[static_cast<std::size_t>(a)], &y = fits[static_cast<std::size_t>(b)];
    if (x.sim.has_value() != y.sim.has_value()) return x.sim.has_value();
    if (!x.sim || x.sim->iteration_s == y.sim->iteration_s) return x.index < y.index;
    return x.sim->iteration_s < y.sim->iteration_s;
  });
  for (int i : order) {
    out.ranked.push_back(std::move(fits[static_cast<std::size_t>(i)]));
    out.fast_rank.push_back(i);
  }
  for (std::size_t i = n_full; i < fits.size(); ++i) out.ranked.push_back(std::move(fits[i]));
  return out;
}

}  // namespace meshtrain::planner
