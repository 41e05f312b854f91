// `meshtrain plan`: parses the flags, runs the planner's search
// (engine/planner/planner.h) and prints its ranking, its JSON, the winner's
// plan file and the explanation.
#include <unistd.h>

#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "core/names.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/pictures/pictures.h"
#include "engine/plan/fp8_recipe.h"
#include "engine/planner/candidates.h"
#include "engine/planner/planner.h"
#include "engine/planner/report.h"
#include "engine/planner/segment_candidates.h"
#include "engine/step/step_engine.h"
#include "simulator/calibration.h"

namespace meshtrain {

namespace {

struct PlanCommandFlags {
  std::string model, cluster = "dgx-a100", calibration, out, svg;
  SoftwareFlags software;  // the simulated software stack
  int gpus = 0;
  std::optional<int> global_batch, seq_len;
  std::string precision = "bf16", grad_sync = "overlap", grad_dtype = "fp32", fp8_recipe = "delayed";
  std::vector<std::string> recompute_modules;
  double grad_bucket_mb = Plan{}.grad_bucket_mb;
  int top = 10, simulate = 32, segments = planner::PlannerOptions{}.segments;
  std::string layouts;  // empty: all, or uniform when --fix/--allow pin the uniform dimensions
  bool json = false, explain = false, progress = false, no_progress = false;
  std::vector<std::string> fix, allow;
};

// The search's options: what to simulate, which layouts (by default only the kinds the pins name), progress.
Result<planner::PlannerOptions> planner_options(const PlanCommandFlags& f, const planner::SplitPins& pins) {
  planner::PlannerOptions po;
  po.simulate = f.simulate;
  // Pins name the uniform plans' dimensions (tp=8) or the segments' (vision.tp=2): by default only the kinds named.
  const bool uniform_pins = !pins.uniform_fix.empty() || !pins.uniform_allow.empty();
  const bool segment_pins = !pins.segments.empty();
  const std::string layouts = !f.layouts.empty()              ? f.layouts
                              : uniform_pins == segment_pins ? "all"
                              : uniform_pins                 ? "uniform"
                                                             : "segments";
  if (layouts != "all" && layouts != "uniform" && layouts != "segments")
    return Error(unknown_name_message("--layouts", layouts, {"all", "uniform", "segments"}));
  po.uniform = layouts != "segments";
  po.segments = layouts == "uniform" ? 0 : f.segments;
  if (layouts == "segments" && po.segments == 0)
    return make_error("--layouts segments with --segments 0 searches nothing; give --segments 1 or more");
  if (segment_pins && po.segments == 0)
    return make_error("--fix/--allow {} pin segment layouts, which --layouts uniform (or --segments 0) leaves out; "
                      "drop them or search segment layouts",
                      pins.segments.describe());
  // The mirror case: a uniform plan's pins would be dropped without a word.
  if (uniform_pins && !po.uniform)
    return make_error("--fix/--allow {} pin uniform plans, which --layouts segments leaves out; pin a segment's "
                      "dimension as <module>.<dimension> (vision.tp=2), or search --layouts all",
                      fmt::format("{}", fmt::join(pins.uniform_fix.empty() ? pins.uniform_allow : pins.uniform_fix, ",")));
  po.progress = !f.no_progress && (f.progress || isatty(STDERR_FILENO));
  return po;
}

// --out (the winner's plan file) and --svg (the candidates' picture).
Status write_plan_outputs(const PlanCommandFlags& f, const planner::SearchResult& result,
                          const planner::SearchContext& ctx, const sim::ClusterSpec& cluster) {
  if (!f.out.empty()) {
    const planner::Candidate& best = result.ranked.front();
    if (!best.sim)
      return make_error("--out: the full simulation refused every candidate it timed (first: {}); nothing to write",
                        best.sim_error.empty() ? "none simulated, use --simulate 1 or more" : best.sim_error);
    MT_TRY(write_output_file(f.out, planner::plan_file_json(best).dump(2) + "\n", "--out plan file"));
  }
  if (!f.svg.empty()) {
    std::vector<std::string> labels;
    for (const planner::Candidate& c : result.ranked)
      labels.push_back(c.plan.segments.empty() ? planner::describe_plan(c.plan, ctx.model)
                                               : planner::describe_segments_short(c.plan));
    const std::string title = fmt::format("Plans for {} on {} x {}: step time against memory", ctx.model.name, f.gpus,
                                          cluster.device.name);
    MT_TRY(write_output_file(f.svg, pictures::candidates_svg(result.ranked, cluster.device.memory_bytes, labels, title),
                             "--svg picture"));
  }
  return ok_status();
}

Status run_plan(const PlanCommandFlags& f) {
  if (f.model.empty()) return make_error("--model NAME|FILE is required");
  if (f.gpus <= 0) return make_error("--gpus N is required: the GPUs the plan must use");
  if (!f.out.empty()) MT_TRY(probe_output_file(f.out, "--out plan file"));  // before the search, not after
  if (!f.svg.empty()) MT_TRY(probe_output_file(f.svg, "--svg picture"));
  planner::SearchContext ctx;
  MT_ASSIGN(ctx.model, load_model(f.model));
  ctx.gpus = f.gpus;
  ctx.base.global_batch = f.global_batch.value_or(f.gpus);
  ctx.base.seq_len = f.seq_len.value_or(0);
  MT_ASSIGN(ctx.base.precision, parse_precision(f.precision));
  MT_ASSIGN(ctx.base.grad_sync, parse_grad_sync(f.grad_sync));
  MT_ASSIGN(ctx.base.grad_dtype, parse_grad_dtype(f.grad_dtype));
  MT_ASSIGN(ctx.base.fp8_recipe, parse_fp8_recipe(f.fp8_recipe));
  MT_ASSIGN(ctx.base.recompute_modules, parse_recompute_modules(f.recompute_modules));
  ctx.base.grad_bucket_mb = f.grad_bucket_mb;

  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  ctx.gpus_per_node = options.cluster.gpus_per_node;
  // Before the search: otherwise every candidate would be refused one by one for the same reason.
  if (ctx.base.precision == Precision::fp8) MT_TRY(check_fp8_device(options.cluster.device));
  MT_TRY(check_fp8_recipe(ctx.base));
  sim::Calibration calibration;
  if (!f.calibration.empty())
    MT_TRY(apply_calibration(f.calibration, "threads", f.gpus, ctx.base.precision, calibration, options));
  MT_TRY(apply_software_flags(f.software, options));
  ctx.step.dropout = f.software.dropout;
  MT_TRY(check_step_options(ctx.step));

  MT_ASSIGN(planner::SplitPins pins, planner::split_pins(f.fix, f.allow, ctx));
  MT_ASSIGN(planner::SearchSpace space, planner::parse_search_space(pins.uniform_fix, pins.uniform_allow, ctx));
  MT_ASSIGN(const planner::PlannerOptions po, planner_options(f, pins));
  MT_ASSIGN(planner::SearchResult result, planner::search(ctx, space, options, po, pins.segments));
  MT_TRY(write_plan_outputs(f, result, ctx, options.cluster));

  const planner::ReportContext rc{&ctx, &options.cluster, f.top};
  if (f.json) {
    nlohmann::json j = planner::json_report(result, rc);
    if (f.explain) j["explain"] = planner::explain(result, rc);
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}", planner::text_report(result, rc));
    if (f.explain) fmt::print("{}", planner::explain(result, rc));
    if (!f.out.empty()) fmt::print("wrote the winner to {} (meshtrain train/simulate --plan {})\n", f.out, f.out);
  }
  return {};
}

std::string dimension_help() {
  std::string s = "plan dimensions:";
  for (const planner::Dimension& d : planner::dimensions()) s += fmt::format("\n  {:<19} {}", d.name, d.help);
  s += fmt::format(
      "\nsegment layouts (--fix/--allow MODULE.DIM, the segment holding MODULE; `meshtrain info --model M` lists the "
      "modules):\n  MODULE.{{{}}}\n  segments.count      2 or 3 segments\n  segments.microbatches  micro-batches "
      "of every segment",
      fmt::join(planner::segment_dimension_names(), ","));
  return s;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanCommandFlags>();
  CLI::App* sub = app.add_subcommand("plan", "search parallel plans for a model on a cluster: memory model, fast "
                                             "estimate, then the full simulation of the best");
  sub->footer(dimension_help());
  sub->add_option("--model", f->model, "model preset name or JSON model file")->required();
  add_cluster_flags(*sub, f->cluster, f->gpus, "GPUs the plan uses")->required();
  sub->add_option("--global-batch", f->global_batch, "sequences (images) per iteration (default: one per GPU)")
      ->check(int_in({1, kMaxGlobalBatch}));
  sub->add_option("--seq-len", f->seq_len, "sequence length (default: the model's)")->check(int_in({1, 1 << 24}));
  sub->add_option("--precision", f->precision, "fp32, bf16, fp16 or fp8 (FP8 linear GEMMs; needs FP8 devices)")->capture_default_str();
  sub->add_option("--grad-bucket-mb", f->grad_bucket_mb, "MiB of fp32 gradients per data-parallel bucket (every candidate)")
      ->capture_default_str()
      ->check(real_in(kGradBucketMbRange));
  sub->add_option("--grad-sync", f->grad_sync, "overlap or after-backward (every candidate)")->capture_default_str();
  sub->add_option("--grad-dtype", f->grad_dtype,
                  "gradients in fp32 or bf16 (every candidate; bf16 needs precision bf16 or fp8)")
      ->capture_default_str();
  sub->add_option("--recompute-modules", f->recompute_modules,
                  "layernorm and/or moe_act, comma-separated: recomputed in every candidate that does not recompute "
                  "whole layers (--allow recompute_modules=none,moe_act,layernorm+moe_act searches sets)")
      ->delimiter(',');
  sub->add_option("--fp8-recipe", f->fp8_recipe,
                  "with --precision fp8: delayed or current scaling (every candidate)")
      ->capture_default_str();
  sub->add_option("--top", f->top, "rows to print")->capture_default_str()->check(int_in({1, 1 << 20}));
  sub->add_option("--simulate", f->simulate, "candidates the full simulation re-times (the fast tier's best)")
      ->capture_default_str()
      ->check(int_in({0, 1 << 20}));
  sub->add_option("--layouts", f->layouts,
                  "all, uniform or segments: segment layouts place an image model's modules apart (2 or 3 segments, "
                  "per-segment tp/pp/dp/ZeRO/recompute/sp, same ranks or a pipeline boundary); default all, or only "
                  "the kind --fix/--allow name");
  sub->add_option("--segments", f->segments, "segment layouts the full simulation times (the fast tier's best)")
      ->capture_default_str()
      ->check(int_in({0, 1 << 20}));
  sub->add_option("--fix", f->fix,
                  "pin dimensions: name=value[,name=value...], e.g. tp=8,pp=4; a segment's as MODULE.DIM, e.g. "
                  "vision.tp=2,language.pp=4,segments.count=3");
  sub->add_option("--allow", f->allow,
                  "values to search: name=v1,v2[,...], e.g. tp=1,2,4,16 or recompute=full, or vision.zero=0,1");
  sub->add_option("--calibration", f->calibration, "calibration JSON (meshtrain calibrate) replacing the defaults");
  add_software_flags(*sub, f->software);
  sub->add_option("--out", f->out, "write the winner as a plan file (train/simulate --plan)");
  sub->add_option("--svg", f->svg,
                  "write an SVG picture of the candidates: step time against peak memory, the chosen one marked");
  sub->add_flag("--json", f->json, "print one JSON object");
  sub->add_flag("--explain", f->explain, "say why the winner beats the runner-up");
  sub->add_flag("--progress", f->progress, "draw the progress line even when stderr is not a terminal");
  sub->add_flag("--no-progress", f->no_progress, "never draw the progress line");
  return {sub, [f] { return run_plan(*f); }};
}

}  // namespace meshtrain
