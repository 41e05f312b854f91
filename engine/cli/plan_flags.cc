#include "engine/cli/plan_flags.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "engine/cli/bounded_flags.h"
#include "engine/plan/segment_plan.h"
#include "engine/step/step_engine.h"

namespace meshtrain {

void add_software_flags(CLI::App& app, SoftwareFlags& f) {
  app.add_option("--attention", f.attention,
                 "attention kernels of the simulated software: flash (fused) or unfused (Megatron-LM 2021: "
                 "score GEMM, softmax, dropout, context GEMM)")
      ->capture_default_str();
  app.add_option("--cross-entropy", f.cross_entropy,
                 "loss kernels of the simulated software: fused (reading the 16-bit logits) or unfused "
                 "(Megatron's fp32 PyTorch ops, its default before --cross-entropy-loss-fusion)")
      ->capture_default_str();
  app.add_option("--dropout", f.dropout, "dropout probability of the simulated run (hidden states; "
                 "with --attention unfused also the attention probabilities)")
      ->capture_default_str()
      ->check(real_in(kDropoutRange));
  app.add_option("--moe-routing", f.moe_routing,
                 "how tokens spread over experts: uniform, zipf:S (share of expert e ∝ 1/(e+1)^S) or file:F "
                 "(a JSON list of shares per expert, or one list per MoE layer)")
      ->capture_default_str();
  app.add_option("--moe-dispatcher", f.moe_dispatcher,
                 "how the token rows cross the expert group: alltoall (every expert slot, NCCL) or deepep / "
                 "hybridep (Megatron-Core's flex dispatcher: each token once per destination node and GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"alltoall", "deepep", "hybridep"}));
  app.add_flag("--moe-sequential-experts", f.moe_sequential_experts,
               "the simulated software runs each local expert's GEMMs in turn, one launch each (Megatron's "
               "SequentialMLP, without --moe-grouped-gemm), not as one grouped GEMM");
}

Status apply_software_flags(const SoftwareFlags& f, SimulateOptions& o) {
  MT_ASSIGN(o.kernels.attention, attention_impl_from_name(f.attention));
  MT_ASSIGN(o.kernels.cross_entropy, cross_entropy_impl_from_name(f.cross_entropy));
  o.kernels.dropout = f.dropout;
  MT_ASSIGN(o.moe_routing, MoeRouting::parse(f.moe_routing));
  o.moe_dispatcher = f.moe_dispatcher;
  o.kernels.moe_grouped_gemm = !f.moe_sequential_experts;
  return ok_status();
}

void add_plan_flags(CLI::App& app, PlanFlags& f, const std::string& default_model) {
  // A switch sets its field only when given: CLI11 (2.1) writes false into an
  // optional<bool> flag that is absent, which would override a plan file's true.
  // `--x` sets a switch, `--x=false` (or 0, off) clears it over a plan file's true, the last given
  // wins, and a value that is no boolean is a usage error (add_flag_function's count would throw).
  auto on_switch = [&app](const char* name, std::optional<bool>& field, const char* help) {
    app.add_flag(name)->description(help)->each([&field, name](const std::string& value) {
      bool on = false;
      if (!CLI::detail::lexical_cast(value, on)) throw CLI::ConversionError(value, name);
      field = on;
    });
  };
  f.model = default_model;
  app.add_option("--model", f.model, "model preset name or JSON model file")->capture_default_str();
  app.add_option("--plan", f.plan_file, "JSON plan file (flags override its fields)");
  auto& o = f.overrides;
  // An unset plan flag leaves the plan file's value or the default plan's: --help shows the latter.
  const nlohmann::json defaults = plan_to_json(Plan{});
  auto shown = [&defaults](CLI::Option* option, const char* key) {
    const auto it = defaults.find(key);
    if (it != defaults.end() && !it->is_null()) option->default_str(it->is_string() ? it->get<std::string>() : it->dump());
    return option;
  };
  for (const PlanIntField& field : plan_int_fields())
    shown(app.add_option(field.flag, o.*field.member, field.help), field.key)->check(int_in(field.range));
  shown(app.add_option("--recompute", o.recompute, "activation recomputation: none, selective, full"), "recompute");
  app.add_option("--recompute-modules", o.recompute_modules,
                 "modules also recomputed in backward, comma-separated: layernorm (an MoE layer's pre-MLP norm), "
                 "moe_act (the routed experts' activation); Megatron-Core's --recompute-modules beyond core_attn, "
                 "which --recompute selective is")
      ->delimiter(',');
  shown(app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1"), "schedule");
  shown(app.add_option("--precision", o.precision, "fp32, bf16, fp16 or fp8 (fp8: simulated on H100/H200; trained on the cpu backend as exact emulation)"),
        "precision");
  shown(app.add_option("--grad-bucket-mb", o.grad_bucket_mb,
                       "MiB of fp32 gradients per data-parallel all-reduce under ZeRO 0/1 (PyTorch DDP: 25)"),
        "grad_bucket_mb")
      ->check(real_in(kGradBucketMbRange));
  shown(app.add_option("--grad-sync", o.grad_sync,
                       "when gradient buckets are reduced: overlap (with backward) or after-backward (Megatron "
                       "local DDP)"),
        "grad_sync");
  shown(app.add_option("--grad-dtype", o.grad_dtype,
                       "what gradients accumulate and are reduced in: fp32 (Megatron's main_grad) or bf16 (the 16-bit "
                       "working dtype, Megatron-Core's grad_reduce_in_fp32 false; simulated only, train refuses it)"),
        "grad_dtype");
  shown(app.add_option("--fp8-recipe", o.fp8_recipe,
                       "with --precision fp8, how FP8 tensors are scaled: delayed (Transformer Engine's "
                       "DelayedScaling, from the last steps' amax) or current (Float8CurrentScaling, Megatron's "
                       "tensorwise: each tensor's own amax, measured before its cast)"),
        "fp8_recipe");
  shown(app.add_option("--cp-comm", o.cp_comm,
                       "how context parallelism exchanges keys and values: allgather (Llama 3) or ring"),
        "cp_comm");
  app.add_option("--chunk-layers", o.chunk_layers,
                 "layers of every virtual stage, comma-separated (pp·vpp numbers; 0 for a chunk holding only the "
                 "embedding or the head)")
      ->delimiter(',')
      ->check(CLI::Range(kChunkLayersRange.min, kChunkLayersRange.max));
  on_switch("--account-for-embedding-in-pipeline-split", o.embedding_in_split,
               "count the embedding as a layer of the pipeline split (Megatron-Core)");
  on_switch("--account-for-loss-in-pipeline-split", o.loss_in_split,
               "count the final norm, head and loss as a layer of the pipeline split (Megatron-Core)");
  shown(app.add_option("--grad-compression", o.grad_compression,
                       "data-parallel gradients on the wire: none, bf16, fp16 (cast) or 1bit (signs, error feedback)"),
        "grad_compression");
  app.add_flag_callback(
      "--no-error-feedback", [&o] { o.error_feedback = false; },
      "1bit: drop each rank's compression error instead of adding it to the next step (to measure what it is worth)");
  on_switch("--zero-reduce-once", o.zero_reduce_once,
               "ZeRO 2/3: reduce-scatter gradients once per step after local accumulation, not per micro-batch");
  app.add_flag_callback(
      "--no-prefetch-across-chunks", [&o] { o.prefetch_across_chunks = false; },
      "ZeRO 3: prefetch parameters within a chunk's pass only, not the next schedule action's first layer");
  on_switch("--megatron-buckets", o.megatron_buckets,
            "ZeRO 0/1: Megatron-Core's gradient buckets (max(40M, 1M·dp) parameters on the first stage's first "
            "chunk, one bucket per chunk elsewhere) instead of --grad-bucket-mb");
  on_switch("--overlap-update", o.overlap_update,
               "run each bucket's optimizer update on the data-parallel stream; the next forward of a layer waits "
               "only for its own update");
  on_switch("--tp-comm-overlap", o.tp_comm_overlap,
            "sequence parallelism: pipeline the all-gather before the column-parallel GEMMs with them (a ring of "
            "send/recv on a side stream, the GEMM row block by row block)");
  on_switch("--fp8-param-gather", o.fp8_param_gather,
            "precision fp8 with ZeRO 1-3: keep the FP8 linears' weights as FP8 parameters, cast from the master "
            "shards and all-gathered at one byte an element, with no 16-bit copy (Megatron-Core's "
            "--fp8-param-gather; simulated only)");
  on_switch("--overlap-p2p-comm", o.overlap_p2p_comm,
            "interleaved schedule: post each pipeline receive ahead on a stream of its own, so the transfer runs "
            "under compute (Megatron-Core's --overlap-p2p-communication)");
  on_switch("--moe-a2a-overlap", o.moe_a2a_overlap,
            "expert parallelism: each steady-state forward runs interleaved with an earlier micro-batch's backward, "
            "layer by layer, the token all-to-alls of one under the other's compute (Megatron-Core's "
            "--overlap-moe-expert-parallel-comm; one warm-up forward more)");
  shown(app.add_option("--offload", o.offload,
                       "host memory for the optimizer: none, optimizer (fp32 master weights and AdamW state, updated "
                       "on the host) or params (ZeRO 3: the parameter shards too)"),
        "offload");
  on_switch("--sequence-parallel", o.sequence_parallel, "split norms and dropout over the sequence (tp)");
}

Status dp_from_gpus(PlanFlags& f, int gpus) {
  PlanOverrides& o = f.overrides;
  if (gpus <= 0 || o.dp) return ok_status();
  PlanOverrides file;
  if (!f.plan_file.empty()) {
    MT_ASSIGN(file, plan_overrides_from_file(f.plan_file));
  }
  // A plan of segments sizes its world from its segments (validate_plan checks --gpus against them).
  if (file.dp || file.segments) return ok_status();
  // Each degree is bounded (plan.h), so the product fits in 64 bits.
  const std::int64_t mp = std::int64_t{o.tp.value_or(file.tp.value_or(1))} * o.pp.value_or(file.pp.value_or(1)) *
                          o.cp.value_or(file.cp.value_or(1));
  if (gpus % mp != 0)
    return make_error("--gpus {} is not a multiple of tp·pp·cp = {}; pass a multiple or set --dp", gpus, mp);
  o.dp = static_cast<int>(gpus / mp);
  return ok_status();
}

namespace {

// Each segment lays itself out from tp = pp = dp = vpp = 1 (segments_from_json):
// a whole plan's degree beside "segments" would be accepted and ignored.
// `file` names the plan file the overrides came from; empty: the flags.
Status check_no_whole_layout(const PlanOverrides& o, const std::string& file) {
  const std::pair<std::string, bool> given[] = {
      {"tp", o.tp.has_value()}, {"pp", o.pp.has_value()}, {"dp", o.dp.has_value()}, {"vpp", o.vpp.has_value()},
      {"first_stage_layers", o.first_stage_layers.has_value()},
      {"last_stage_layers", o.last_stage_layers.has_value()}};
  for (const auto& [name, is_given] : given) {
    if (!is_given) continue;
    std::string flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return make_error("{} sets {} for the whole plan, but a plan of \"segments\" lays out each segment itself "
                      "and would ignore it: give \"{}\" inside the segments",
                      file.empty() ? flag : fmt::format("plan file '{}'", file),
                      file.empty() ? "it" : fmt::format("\"{}\"", name), name);
  }
  return ok_status();
}

}  // namespace

Result<ModelAndPlan> resolve_model_and_plan(const PlanFlags& f, int world_size) {
  ModelAndPlan r;
  MT_ASSIGN(r.model, load_model(f.model));
  Plan plan;
  std::shared_ptr<const nlohmann::json> segments;
  PlanOverrides from_file;
  if (!f.plan_file.empty()) {
    MT_ASSIGN(from_file, plan_overrides_from_file(f.plan_file));
    MT_ASSIGN(plan, apply_overrides(plan, from_file));
    segments = from_file.segments;
  }
  MT_ASSIGN(r.plan, apply_overrides(plan, f.overrides));
  if (segments) {
    MT_TRY(check_no_whole_layout(from_file, f.plan_file));
    MT_TRY(check_no_whole_layout(f.overrides, ""));
    // The segments take the whole plan's fields (flags included) as their defaults.
    auto parsed = segments_from_json(*segments, r.model, r.plan);
    if (!parsed) return std::move(parsed.context(fmt::format("plan file '{}'", f.plan_file))).error();
    r.plan.segments = std::move(parsed).value();
  }
  auto status = validate_plan(r.plan, r.model, world_size);
  if (!status.ok()) return std::move(status.context(fmt::format("plan for model '{}'", r.model.name))).error();
  return r;
}

}  // namespace meshtrain
