// validate_sim: predicted vs published measurements, one row per measured run.
//
//   validate_sim [--tolerance 0.10] [--median-tolerance 0.05] [--json] TABLE.json...
//
// A table (experiments/validation/*.json) names its source, the cluster
// preset, how the publication counted FLOPs, and rows of {model, gpus, plan,
// measured, source} (a row of a model with experts may add "moe_routing" and
// "moe_dispatcher"). Each row is simulated once with `meshtrain simulate`'s
// simulate_iteration and the built-in constants (simulator/constants.h and
// the cluster preset): nothing here is tuned per row. The predicted figure is
// the publication's own FLOP count divided by the predicted iteration time
// (with overlapped updates the steady state, the second of two iterations,
// as a published average over many sees it) and the GPU count, so the two columns compare like with like.
//
// Exit status: 0 when every row is within the tolerance and each table's
// median |error| within the median tolerance, 1 otherwise (or on a bad
// table), so a script (and ctest) can gate on it.
//
// A table (or a row, overriding it) may describe the measured system's
// software in "system": {"attention": "flash" | "unfused", "cross_entropy":
// "fused" | "unfused", "moe_grouped_gemm": true | false, "dropout": P}: facts
// of how the published runs were made (which attention, loss and expert
// kernels their framework had, which dropout they trained with), applied as
// SimulateOptions, never fitted.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "engine/plan/plan.h"
#include "engine/simulation/simulation.h"
#include "models/model_spec.h"

namespace meshtrain {
namespace {

using nlohmann::json;

// FLOPs of one iteration as the publication counts them.
//  megatron-2021: Narayanan et al. 2021, Sec. 5.1 / Appendix: with full
//    recomputation, 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
//  megatron-core: Megatron-LM's num_floating_point_operations (training.py,
//    MCore v0.9 to v0.11), which its logs' TFLOP/s divide: 12·B·s·l·h²·
//    ((1 + G/H + s/h)·(H·D/h) + (F/h)·k·g + (F_shared/h)·g + V/(2·l·h)),
//    k = top_k (1 dense), g = 3/2 for gated MLPs; full s² attention, no
//    router, every layer counted as an MoE layer, no recomputation.
//  megatron-core-causal: the same with the causal half of the s² attention
//    (s/(2h) for s/h): the scores a causal kernel computes.
Result<double> publication_flops(const std::string& formula, const ModelSpec& m, const Plan& p) {
  const double B = p.effective_global_batch(), s = p.effective_seq_len(m), l = m.layers,
               h = m.hidden, V = m.vocab;
  if (formula == "megatron-2021")
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
  if (formula == "megatron-core" || formula == "megatron-core-causal") {
    const double H = m.heads, G = m.kv_heads, D = m.head_dim(), F = m.ffn, k = m.moe() ? m.top_k : 1;
    const double g = m.activation == Activation::swiglu ? 1.5 : 1.0, shared = m.shared_experts * F;
    const double attention = formula == "megatron-core" ? s / h : s / (2.0 * h);
    return 12.0 * B * s * l * h * h *
           ((1.0 + G / H + attention) * (H * D / h) + F / h * k * g + shared / h * g + V / (2.0 * l * h));
  }
  return make_error("unknown FLOP formula '{}'; known: megatron-2021, megatron-core, megatron-core-causal", formula);
}

struct Row {
  std::string model, plan, source;
  int gpus = 0;
  double measured = 0, predicted = 0, error = 0;  // error = predicted / measured - 1
  double iteration_s = 0, bubble = 0, idle = 0, exposed_comm_s = 0, peak_gib = 0, wall_s = 0;
  IdleBreakdown idle_by_cause;
};

std::string describe(const Plan& p) {
  std::string s = fmt::format("tp{} pp{} dp{}", p.tp, p.pp, p.dp);
  if (p.ep > 1) s += fmt::format(" ep{} etp{}", p.ep, p.expert_tp());
  if (p.cp > 1) s += fmt::format(" cp{}", p.cp);
  if (p.vpp > 1) s += fmt::format(" vpp{}", p.vpp);
  s += fmt::format(" mb{} gb{} {}", p.micro_batch, p.effective_global_batch(),
                   schedule_name(p.schedule));
  if (p.recompute != Recompute::none || p.recompute_modules.any()) s += " rc-" + recompute_label(p);
  if (p.grad_dtype != GradDtype::fp32) s += " " + grad_dtype_name(p.grad_dtype) + "-grads";
  if (p.precision == Precision::fp8) s += " fp8-" + fp8_recipe_name(p.fp8_recipe);
  if (p.fp8_param_gather) s += " fp8-params";
  if (p.moe_a2a_overlap) s += " a2a-overlap";
  if (p.overlap_p2p_comm) s += " p2p-overlap";
  return s;
}

Result<json> read_json(const std::string& path) { return load_json_file(path, "validation table"); }

// Applies a "system" object (see the top of this file) to `o`.
Status apply_system(const json& system, SimulateOptions& o) {
  if (!system.is_object()) return make_error("\"system\" must be an object like {{\"attention\": \"unfused\", \"dropout\": 0.1}}");
  for (const auto& [key, value] : system.items()) {
    if (key == "attention" && value.is_string()) {
      MT_ASSIGN(o.kernels.attention, attention_impl_from_name(value.get<std::string>()));
    } else if (key == "cross_entropy" && value.is_string()) {
      MT_ASSIGN(o.kernels.cross_entropy, cross_entropy_impl_from_name(value.get<std::string>()));
    } else if (key == "moe_grouped_gemm" && value.is_boolean()) {
      o.kernels.moe_grouped_gemm = value.get<bool>();
    } else if (key == "dropout" && value.is_number()) {
      o.kernels.dropout = value.get<float>();
    } else {
      return make_error("\"system\": unknown or mistyped field '{}'; known: \"attention\" (\"flash\" or \"unfused\"), "
                        "\"cross_entropy\" (\"fused\" or \"unfused\"), \"moe_grouped_gemm\" (true or false), "
                        "\"dropout\" (a number in [0, 1))",
                        key);
    }
  }
  return ok_status();
}

Result<std::vector<Row>> run_table(const std::string& path) {
  MT_ASSIGN(json t, read_json(path));
  for (const char* key : {"source", "cluster", "flops", "rows"})
    if (!t.contains(key)) return make_error("table '{}' has no field '{}'", path, key);
  // tflops_per_gpu: the publication's FLOP count over the predicted time;
  // tokens_per_s: global batch · seq over the predicted time (no FLOP count).
  const std::string metric = t.value("metric", "");
  if (metric != "tflops_per_gpu" && metric != "tokens_per_s")
    return make_error("table '{}': metric must be \"tflops_per_gpu\" or \"tokens_per_s\"", path);
  MT_ASSIGN(sim::ClusterSpec cluster, sim::cluster_spec_by_name_or_file(t["cluster"]));
  const std::string formula = t["flops"];
  std::vector<Row> rows;
  for (const json& r : t["rows"]) {
    for (const char* key : {"model", "gpus", "plan", "measured", "source"})
      if (!r.contains(key))
        return make_error("table '{}': row {} has no field '{}'", path, rows.size() + 1, key);
    Row row;
    row.model = r["model"].is_string() ? r["model"].get<std::string>() : r["model"].value("name", "custom");
    row.gpus = r["gpus"];
    row.measured = r["measured"];
    row.source = r["source"];
    ModelSpec m;
    if (r["model"].is_string()) {
      MT_ASSIGN(m, model_preset(r["model"].get<std::string>()));
    } else {
      MT_ASSIGN(m, model_from_json(r["model"]));
    }
    MT_ASSIGN(PlanOverrides o, plan_overrides_from_json(r["plan"]));
    MT_ASSIGN(Plan p, apply_overrides(Plan{}, o));
    if (Status s = validate_plan(p, m, row.gpus); !s)
      return std::move(s.context(fmt::format("table '{}' row {} ({})", path, rows.size() + 1, row.model)))
          .error();
    SimulateOptions options;
    options.cluster = cluster;
    const std::string where = fmt::format("table '{}' row {} ({})", path, rows.size() + 1, row.model);
    if (t.contains("system")) MT_TRY(apply_system(t["system"], options).context(where));
    if (r.contains("system")) MT_TRY(apply_system(r["system"], options).context(where));
    if (r.contains("moe_dispatcher")) options.moe_dispatcher = r["moe_dispatcher"].get<std::string>();
    if (r.contains("moe_routing")) {
      MT_ASSIGN(options.moe_routing, MoeRouting::parse(r["moe_routing"].get<std::string>()));
    }
    row.plan = describe(p) + fmt::format(" {}-attn", attention_impl_name(options.kernels.attention));
    if (options.kernels.dropout > 0) row.plan += fmt::format(" drop{:g}", options.kernels.dropout);
    if (options.kernels.cross_entropy == CrossEntropyImpl::unfused) row.plan += " unfused-ce";
    if (!options.kernels.moe_grouped_gemm) row.plan += " seq-experts";
    if (options.moe_dispatcher != "alltoall") row.plan += " " + options.moe_dispatcher;
    // The measured runs fit on the real machines; a predicted peak above the
    // device is reported in its own column rather than stopping the table.
    options.check_memory = false;
    // A published throughput is an average over many iterations. With the
    // update overlapped (Megatron's --overlap-param-gather) an iteration's
    // forward overlaps the previous one's tail, which only the second of two
    // simulated iterations shows; otherwise the first is the same.
    options.steady_state = p.overlap_update;
    const auto start = std::chrono::steady_clock::now();
    auto sim = simulate_iteration(m, p, options);
    row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!sim) return std::move(sim.context(fmt::format("table '{}' row {} ({})", path, rows.size() + 1, row.model))).error();
    row.iteration_s = sim->iteration_s;
    if (metric == "tokens_per_s") {
      row.predicted = sim->tokens_per_s;
    } else {
      MT_ASSIGN(double flops, publication_flops(formula, m, p));
      row.predicted = flops / sim->iteration_s / p.world_size() / 1e12;
    }
    row.error = row.predicted / row.measured - 1.0;
    row.bubble = sim->bubble_fraction;
    row.idle = sim->idle_fraction;
    row.idle_by_cause = sim->idle;
    row.exposed_comm_s = sim->exposed_comm_s;
    row.peak_gib = static_cast<double>(sim->peak_memory_bytes) / (1024.0 * 1024.0 * 1024.0);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  using namespace meshtrain;
  CLI::App app{"predicted vs published measurements (experiments/validation/*.json)"};
  std::vector<std::string> tables;
  double tolerance = 0.10, median_tolerance = 0.05;
  bool as_json = false;
  app.add_option("tables", tables, "validation tables (JSON)")->required();
  app.add_option("--tolerance", tolerance, "largest accepted |predicted / measured - 1|")->capture_default_str();
  app.add_option("--median-tolerance", median_tolerance, "largest accepted median |error| of a table")
      ->capture_default_str();
  app.add_flag("--json", as_json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);

  json out = json::array();
  bool all_within = true;
  for (const std::string& path : tables) {
    auto rows = run_table(path);
    if (!rows) {
      std::fprintf(stderr, "validate_sim: error: %s\n", rows.error().message().c_str());
      return 1;
    }
    if (!as_json) {
      fmt::print("{}\n", path);
      fmt::print("  {:<16} {:>5} {:<72} {:>9} {:>9} {:>7} {:>9} {:>7} {:>7} {:>9} {:>8}\n", "model", "gpus", "plan",
                 "measured", "predicted", "error", "iter s", "bubble", "dp idle", "exp.comm", "peak GiB");
    }
    std::vector<double> errors;
    for (const Row& r : *rows) errors.push_back(std::abs(r.error));
    std::sort(errors.begin(), errors.end());
    const std::size_t h = errors.size() / 2;
    const double median = errors.empty() ? 0 : errors.size() % 2 ? errors[h] : (errors[h - 1] + errors[h]) / 2;
    all_within = all_within && median <= median_tolerance;
    if (!as_json)
      fmt::print("  median |error| {:.1f}%{}\n", 100 * median,
                 median <= median_tolerance ? "" : fmt::format("  <- above the median tolerance {:.0f}%", 100 * median_tolerance));
    for (const Row& r : *rows) {
      const bool within = std::abs(r.error) <= tolerance;
      all_within = all_within && within;
      if (as_json) {
        out.push_back({{"table", path}, {"model", r.model}, {"gpus", r.gpus}, {"plan", r.plan},
                       {"measured", r.measured}, {"predicted", r.predicted}, {"error", r.error},
                       {"iteration_s", r.iteration_s}, {"bubble_fraction", r.bubble}, {"idle_fraction", r.idle},
                       {"idle_data_parallel_s", r.idle_by_cause.data_parallel_s},
                       {"idle_model_parallel_s", r.idle_by_cause.model_parallel_s},
                       {"idle_optimizer_s", r.idle_by_cause.optimizer_s},
                       {"exposed_comm_s", r.exposed_comm_s}, {"peak_memory_gib", r.peak_gib},
                       {"within_tolerance", within}, {"source", r.source}, {"simulator_wall_s", r.wall_s}});
      } else {
        fmt::print("  {:<16} {:>5} {:<72} {:>9.1f} {:>9.1f} {:>+6.1f}% {:>9.3f} {:>6.1f}% {:>6.1f}% {:>9.3f} {:>8.1f}{}\n",
                   r.model, r.gpus, r.plan, r.measured, r.predicted, 100 * r.error, r.iteration_s,
                   100 * r.bubble, 100 * r.idle_by_cause.data_parallel_s / r.iteration_s, r.exposed_comm_s,
                   r.peak_gib, within ? "" : "  <- outside tolerance");
      }
    }
  }
  if (as_json) fmt::print("{}\n", out.dump(2));
  else fmt::print("{} (tolerance ±{:.0f}%)\n", all_within ? "all rows within tolerance" : "some rows outside tolerance", 100 * tolerance);
  return all_within ? 0 : 1;
}
