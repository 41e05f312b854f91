#include "engine/cli/plan_flags.h"

namespace meshtrain {

void add_plan_flags(CLI::App& app, PlanFlags& f, const std::string& default_model) {
  f.model = default_model;
  app.add_option("--model", f.model, "model preset name or JSON model file")->capture_default_str();
  app.add_option("--plan", f.plan_file, "JSON plan file (flags override its fields)");
  auto& o = f.overrides;
  app.add_option("--tp", o.tp, "tensor-parallel size");
  app.add_option("--pp", o.pp, "pipeline-parallel size");
  app.add_option("--dp", o.dp, "data-parallel size");
  app.add_option("--cp", o.cp, "context-parallel size");
  app.add_option("--ep", o.ep, "expert-parallel size (divides dp)");
  app.add_option("--vpp", o.vpp, "model chunks per pipeline stage (interleaved schedule)");
  app.add_option("--zero", o.zero, "ZeRO stage 0-3");
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch");
  app.add_option("--global-batch", o.global_batch, "sequences per iteration (default micro-batch x dp)");
  app.add_option("--micro-batches", o.microbatches, "micro-batches per pipeline per iteration (sets the global batch)");
  app.add_option("--seq-len", o.seq_len, "sequence length (default: the model's)");
  app.add_option("--first-stage-layers", o.first_stage_layers,
                 "layers on the first pipeline stage (default 0: an even share)");
  app.add_option("--last-stage-layers", o.last_stage_layers,
                 "layers on the last pipeline stage (default 0: an even share)");
  app.add_option("--recompute", o.recompute, "activation recomputation: none, selective, full");
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved");
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16");
  app.add_option("--grad-bucket-mb", o.grad_bucket_mb,
                 "MiB of fp32 gradients per data-parallel all-reduce under ZeRO 0/1 (default 4; PyTorch DDP: 25)");
  app.add_option("--grad-sync", o.grad_sync,
                 "when gradient buckets are reduced: overlap (with backward) or after-backward (Megatron local DDP)");
  app.add_flag("--sequence-parallel", o.sequence_parallel, "split norms and dropout over the sequence (tp)");
}

Status dp_from_gpus(PlanFlags& f, int gpus) {
  PlanOverrides& o = f.overrides;
  if (gpus <= 0 || o.dp) return ok_status();
  PlanOverrides file;
  if (!f.plan_file.empty()) {
    MT_ASSIGN(file, plan_overrides_from_file(f.plan_file));
  }
  if (file.dp) return ok_status();
  const int mp = o.tp.value_or(file.tp.value_or(1)) * o.pp.value_or(file.pp.value_or(1)) *
                 o.cp.value_or(file.cp.value_or(1));
  if (gpus % mp != 0)
    return make_error("--gpus {} is not a multiple of tp·pp·cp = {}; pass a multiple or set --dp", gpus, mp);
  o.dp = gpus / mp;
  return ok_status();
}

Result<ModelAndPlan> resolve_model_and_plan(const PlanFlags& f, int world_size) {
  ModelAndPlan r;
  MT_ASSIGN(r.model, load_model(f.model));
  Plan plan;
  if (!f.plan_file.empty()) {
    MT_ASSIGN(PlanOverrides from_file, plan_overrides_from_file(f.plan_file));
    MT_ASSIGN(plan, apply_overrides(plan, from_file));
  }
  MT_ASSIGN(r.plan, apply_overrides(plan, f.overrides));
  auto status = validate_plan(r.plan, r.model, world_size);
  if (!status.ok()) return std::move(status.context(fmt::format("plan for model '{}'", r.model.name))).error();
  return r;
}

}  // namespace meshtrain
