#include "engine/planner/report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "engine/planner/candidates.h"
#include "models/model_io.h"

namespace meshtrain::planner {

namespace {

std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<std::size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = (static_cast<double>(i) + static_cast<double>(j)) / 2;
    i = j + 1;
  }
  return r;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n, mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    sab += (a[i] - ma) * (b[i] - mb), saa += (a[i] - ma) * (a[i] - ma), sbb += (b[i] - mb) * (b[i] - mb);
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

const Candidate* simulated(const SearchResult& r, std::size_t i) {
  return i < r.ranked.size() && r.ranked[i].sim ? &r.ranked[i] : nullptr;
}

std::string throughput(const SimulationResult& s, const ModelSpec& m) {
  return model_io(m).unit() == "image" ? fmt::format("{:.1f} img/s", s.samples_per_s)
                                                   : fmt::format("{:.0f} tok/s", s.tokens_per_s);
}

// Time per collective kind, each counted once (SimulationResult::collectives).
double collective_s(const SimulationResult& s, sim::CollectiveKind k) {
  return s.collectives[static_cast<std::size_t>(k)].time_s;
}

// Seconds with four significant digits, in ms below a second ("17.52 s", "1.052 ms").
std::string seconds(double s) {
  return s < 1 ? fmt::format("{:.4g} ms", s * 1e3) : fmt::format("{:.4g} s", s);
}

// The fast tier's time, or "-" for a segment layout (the fast tier has no model of them).

}  // namespace

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = i + 1; j < a.size(); ++j) {
      const double x = a[i] - a[j], y = b[i] - b[j];
      if (x == 0 && y == 0) continue;
      if (x == 0) ties_a += 1;
      else if (y == 0) ties_b += 1;
      else if ((x > 0) == (y > 0)) concordant += 1;
      else discordant += 1;
    }
  const double denom = std::sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b));
  return denom > 0 ? (concordant - discordant) / denom : 0;
}

TierAgreement tier_agreement(const SearchResult& r, bool segment_layouts) {
  TierAgreement t;
  std::vector<double> fast, full;
  std::vector<int> fast_place;
  for (const Candidate& c : r.ranked) {
    if (!c.sim || c.fast_rank < 0 || c.segments.is_null() == segment_layouts) continue;
    fast.push_back(c.fast.iteration_s);
    full.push_back(c.sim->iteration_s);
    fast_place.push_back(c.fast_rank);
    t.worst_relative_error =
        std::max(t.worst_relative_error, std::abs(c.fast.iteration_s - c.sim->iteration_s) / c.sim->iteration_s);
  }
  t.compared = static_cast<int>(fast.size());
  if (t.compared == 0) return t;
  t.spearman = pearson(ranks_of(fast), ranks_of(full));
  t.kendall_tau = kendall_tau(fast, full);
  // ranked is in DES order: candidate i is in its place when the fast tier put it i-th among the compared.
  std::vector<int> sorted = fast_place;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < fast_place.size(); ++i)
    if (fast_place[i] != sorted[i]) ++t.reranked;
  t.winner_fast_rank = fast_place.front();
  return t;
}

nlohmann::json plan_file_json(const Candidate& c) {
  const Plan& p = c.plan;
  if (!c.segments.is_null()) {
    // The segments as the planner formed them (segment_candidates.h) and the job's fields.
    nlohmann::json j = {{"global_batch", p.effective_global_batch()},
                        {"precision", precision_name(p.precision)},
                        {"segments", c.segments}};
    if (p.seq_len != 0) j["seq_len"] = p.seq_len;
    if (p.grad_bucket_mb != Plan{}.grad_bucket_mb) j["grad_bucket_mb"] = p.grad_bucket_mb;
    if (p.grad_sync != GradSync::overlap) j["grad_sync"] = grad_sync_name(p.grad_sync);
    if (p.grad_dtype != GradDtype::fp32) j["grad_dtype"] = grad_dtype_name(p.grad_dtype);
    if (p.fp8_recipe != Fp8Recipe::delayed) j["fp8_recipe"] = fp8_recipe_name(p.fp8_recipe);
    if (p.fp8_param_gather) j["fp8_param_gather"] = true;
    // The segments inherit the job's modules (segments_from_json starts each from the job's fields).
    if (p.recompute_modules.any()) j["recompute_modules"] = recompute_module_names(p.recompute_modules);
    return j;
  }
  nlohmann::json j = plan_to_json(p);
  // Derived facts that a plan file does not take (world_size) or that
  // repeat the global batch (microbatches).
  j.erase("world_size");
  j.erase("microbatches");
  return j;
}

std::string text_report(const SearchResult& r, const ReportContext& c) {
  const ModelSpec& m = c.ctx->model;
  const Plan& base = c.ctx->base;
  std::string out = fmt::format(
      "plan for {} on {} x {} ({}): global batch {}, seq {}, {}{}\n", m.name, c.ctx->gpus, c.cluster->device.name,
      c.cluster->name, base.effective_global_batch(), base.effective_seq_len(m), precision_label(base),
      grad_dtype_note(base));
  const std::int64_t estimated = r.valid - r.pruned - r.offload_unneeded;
  out += fmt::format(
      "searched {} combinations: {} valid, {} pruned by the memory model, {}{} estimated (fast tier, {} reference "
      "simulations), {} simulated in full\n",
      r.combinations, r.valid, r.pruned,
      r.offload_unneeded > 0 ? fmt::format("{} offload plans left out (the plan fits without), ", r.offload_unneeded)
                             : std::string(),
      estimated, r.reference_simulations, r.simulated);
  out += fmt::format("time: enumeration {:.2f} s ({:.0f} combinations/s), memory model {:.2f} s ({:.0f}/s), fast tier "
                     "{:.2f} s ({:.0f}/s), full tier {:.2f} s ({:.1f}/s)\n",
                     r.enumerate_s, r.combinations / std::max(r.enumerate_s, 1e-9), r.memory_s,
                     r.valid / std::max(r.memory_s, 1e-9), r.fast_s,
                     estimated / std::max(r.fast_s, 1e-9), r.full_s,
                     (r.simulated + r.segment_simulated) / std::max(r.full_s, 1e-9));
  if (r.segment_combinations > 0)
    out += fmt::format("segment layouts: {} formed, {} valid, {} pruned by the memory model, {} estimated (fast "
                       "tier), {} simulated in full ({:.2f} s before the full tier)\n",
                       r.segment_combinations, r.segment_valid, r.segment_pruned,
                       r.segment_valid - r.segment_pruned, r.segment_simulated, r.segments_s);
  out += fmt::format("{:>3}  {:<44} {:>10} {:>10} {:>14} {:>6} {:>10} {:>10} {:>7} {:>10}\n", "#", "plan",
                     "iteration", "fast tier", "throughput", "MFU", "peak mem", "headroom", "bubble", "exp comm");
  const double device = c.cluster->device.memory_bytes;
  const std::size_t rows = std::min(r.ranked.size(), static_cast<std::size_t>(std::max(c.top, 0)));
  for (std::size_t i = 0; i < rows; ++i) {
    const Candidate& k = r.ranked[i];
    const std::string plan = describe_plan(k.plan, m);
    if (k.sim) {
      const SimulationResult& s = *k.sim;
      out += fmt::format("{:>3}  {:<44} {:>10} {:>10} {:>14} {:>5.1f}% {:>10} {:>10} {:>6.1f}% {:>10}\n", i + 1,
                         plan, seconds(s.iteration_s), seconds(k.fast.iteration_s), throughput(s, m), 100 * s.mfu,
                         human_bytes(static_cast<double>(s.peak_memory_bytes)),
                         human_bytes(device - static_cast<double>(s.peak_memory_bytes)), 100 * s.bubble_fraction,
                         seconds(s.exposed_comm_s));
    } else if (!k.sim_error.empty()) {
      out += fmt::format("{:>3}  {:<44} {:>10} {:>10}  refused by the DES: {:.60}\n", i + 1, plan, "-",
                         seconds(k.fast.iteration_s), k.sim_error);
    } else {
      out += fmt::format("{:>3}  {:<44} {:>10} {:>10} {:>14} {:>6} {:>10} {:>10}   (fast tier only)\n", i + 1, plan,
                         "-", seconds(k.fast.iteration_s), "-", "-", human_bytes(k.memory.peak_bytes),
                         human_bytes(device - k.memory.peak_bytes));
    }
  }
  for (bool segments : {false, true}) {
    const TierAgreement t = tier_agreement(r, segments);
    if (t.compared > 1)
      out += fmt::format(
          "fast tier against the DES over {} {}: Spearman {:.3f}, Kendall tau {:.3f}, worst relative error "
          "{:.1f}%; the DES re-ranked {} of them; its winner was the fast tier's #{}\n",
          t.compared, segments ? "segment layouts" : "candidates", t.spearman, t.kendall_tau,
          100 * t.worst_relative_error, t.reranked, t.winner_fast_rank + 1);
  }
  return out;
}

nlohmann::json json_report(const SearchResult& r, const ReportContext& c) {
  const ModelSpec& m = c.ctx->model;
  nlohmann::json ranked = nlohmann::json::array();
  const std::size_t rows = std::min(r.ranked.size(), static_cast<std::size_t>(std::max(c.top, 0)));
  for (std::size_t i = 0; i < rows; ++i) {
    const Candidate& k = r.ranked[i];
    nlohmann::json row = {{"rank", i + 1},
                          {"plan", plan_file_json(k)},
                          {"summary", describe_plan(k.plan, m)},
                          {"layout", k.segments.is_null() ? "uniform" : "segments"},
                          {"fast_iteration_time_s", k.fast.iteration_s},
                          {"fast_breakdown",
                           {{"pipeline_s", k.fast.pipeline_s},
                            {"bubble_s", k.fast.bubble_s},
                            {"p2p_s", k.fast.p2p_s},
                            {"optimizer_s", k.fast.optimizer_s},
                            {"data_parallel_s", k.fast.data_parallel_s}}},
                          {"model_memory_bytes", k.memory.peak_bytes},
                          {"model_memory_stage", k.memory.peak_stage}};
    if (k.fast_rank >= 0) row["fast_rank"] = k.fast_rank + 1;
    if (k.sim) {
      const SimulationResult& s = *k.sim;
      row["iteration_time_s"] = s.iteration_s;
      row["tokens_per_s"] = s.tokens_per_s;
      if (model_io(m).unit() == "image") row["images_per_s"] = s.samples_per_s;
      row["mfu"] = s.mfu;
      row["tflops_per_gpu"] = s.tflops_per_gpu;
      row["peak_memory_bytes"] = s.peak_memory_bytes;
      row["headroom_bytes"] = c.cluster->device.memory_bytes - static_cast<double>(s.peak_memory_bytes);
      row["bubble_fraction"] = s.bubble_fraction;
      row["exposed_comm_s"] = s.exposed_comm_s;
    } else if (!k.sim_error.empty()) {
      row["refused"] = k.sim_error;
    }
    ranked.push_back(std::move(row));
  }
  auto agreement = [&](bool segments) {
    const TierAgreement t = tier_agreement(r, segments);
    return nlohmann::json{{"compared", t.compared},
                          {"spearman", t.spearman},
                          {"kendall_tau", t.kendall_tau},
                          {"worst_relative_error", t.worst_relative_error},
                          {"reranked", t.reranked},
                          {"winner_fast_rank", t.winner_fast_rank + 1}};
  };
  const std::int64_t estimated = r.valid - r.pruned - r.offload_unneeded;
  return {{"model", m.name},
          {"cluster", c.cluster->name},
          {"gpus", c.ctx->gpus},
          {"global_batch", c.ctx->base.effective_global_batch()},
          {"seq_len", c.ctx->base.effective_seq_len(m)},
          {"search",
           {{"combinations", r.combinations},
            {"valid", r.valid},
            {"pruned_by_memory", r.pruned},
            {"offload_unneeded", r.offload_unneeded},
            {"estimated", estimated},
            {"reference_simulations", r.reference_simulations},
            {"simulated", r.simulated},
            {"segment_layouts",
             {{"formed", r.segment_combinations},
              {"valid", r.segment_valid},
              {"pruned_by_memory", r.segment_pruned},
              {"estimated", r.segment_valid - r.segment_pruned},
              {"simulated", r.segment_simulated},
              {"wall_s", r.segments_s}}},
            {"enumerate_s", r.enumerate_s},
            {"memory_s", r.memory_s},
            {"fast_s", r.fast_s},
            {"full_s", r.full_s},
            {"wall_s", r.enumerate_s + r.memory_s + r.fast_s + r.segments_s + r.full_s}}},
          {"agreement", agreement(false)},
          {"segment_agreement", agreement(true)},
          {"ranked", ranked}};
}

std::string explain(const SearchResult& r, const ReportContext& c) {
  const Candidate* a = simulated(r, 0);
  const Candidate* b = simulated(r, 1);
  if (a == nullptr) return "explain: no candidate was simulated in full\n";
  const ModelSpec& m = c.ctx->model;
  if (b == nullptr) return fmt::format("explain: {} is the only candidate the DES timed\n", describe_plan(a->plan, m));
  const SimulationResult &x = *a->sim, &y = *b->sim;
  std::string out = fmt::format("why {} beats {}: {} against {} ({:.2f}% faster)\n", describe_plan(a->plan, m),
                                describe_plan(b->plan, m), seconds(x.iteration_s), seconds(y.iteration_s),
                                100 * (y.iteration_s - x.iteration_s) / y.iteration_s);
  std::string diff;
  if (!a->segments.is_null() || !b->segments.is_null())
    diff = fmt::format("layout {} (runner-up {})", a->segments.is_null() ? "uniform" : "segments",
                       b->segments.is_null() ? "uniform" : "segments");
  else
    for (const Dimension& d : dimensions())
      if (d.get(a->plan) != d.get(b->plan))
        diff += fmt::format("{}{} {} (runner-up {})", diff.empty() ? "" : ", ", d.name, d.format(d.get(a->plan)),
                            d.format(d.get(b->plan)));
  out += fmt::format("  differs in: {}\n", diff.empty() ? "nothing searched" : diff);
  // Per stage means (SimulationResult's terms): compute, idle (the bubble) and exposed communication.
  auto mean = [](const SimulationResult& s, double StageResult::*f) {
    double t = 0, ranks = 0;
    for (const StageResult& st : s.stages) t += st.*f * st.ranks, ranks += st.ranks;
    return t / ranks;
  };
  struct Term {
    const char* name;
    double winner, runner_up;
  };
  const std::vector<Term> terms = {
      {"compute (per stage, mean)", mean(x, &StageResult::compute_s), mean(y, &StageResult::compute_s)},
      {"bubble: compute stream idle", mean(x, &StageResult::idle_s), mean(y, &StageResult::idle_s)},
      {"exposed communication", x.exposed_comm_s, y.exposed_comm_s},
  };
  const Term* decisive = &terms.front();
  for (const Term& t : terms) {
    out += fmt::format("  {:<30} {:>11} vs {:>11} ({}{})\n", t.name, seconds(t.winner), seconds(t.runner_up),
                       t.winner >= t.runner_up ? "+" : "-", seconds(std::abs(t.winner - t.runner_up)));
    if (t.winner - t.runner_up < decisive->winner - decisive->runner_up) decisive = &t;
  }
  const double rec_x = x.hardware_tflops_per_gpu - x.tflops_per_gpu, rec_y = y.hardware_tflops_per_gpu - y.tflops_per_gpu;
  out += fmt::format("  {:<30} {:>7.1f} TF/s vs {:>7.1f} TF/s per GPU spent on recomputed forwards\n",
                     "recomputation", rec_x, rec_y);
  out += "  collectives (each counted once, all stages):\n";
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    const auto kind = static_cast<sim::CollectiveKind>(k);
    if (collective_s(x, kind) == 0 && collective_s(y, kind) == 0) continue;
    out += fmt::format("    {:<28} {:>11} vs {:>11}\n", sim::collective_kind_name(kind),
                       seconds(collective_s(x, kind)), seconds(collective_s(y, kind)));
  }
  const double device = c.cluster->device.memory_bytes;
  out += fmt::format("  {:<30} {:>11} vs {:>11} (headroom {} vs {})\n", "peak memory",
                     human_bytes(static_cast<double>(x.peak_memory_bytes)),
                     human_bytes(static_cast<double>(y.peak_memory_bytes)),
                     human_bytes(device - static_cast<double>(x.peak_memory_bytes)),
                     human_bytes(device - static_cast<double>(y.peak_memory_bytes)));
  out += fmt::format("  the largest saving is in {} ({})\n", decisive->name,
                     seconds(decisive->runner_up - decisive->winner));
  return out;
}

}  // namespace meshtrain::planner
