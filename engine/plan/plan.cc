#include "engine/plan/plan.h"

#include <algorithm>
#include <utility>

#include "engine/plan/segment_plan.h"
#include "models/block.h"
#include "models/model_tables.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "core/names.h"

namespace meshtrain {

namespace {

const std::vector<std::string> kRecomputes = {"none", "selective", "full"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16", "fp8"};
const std::vector<std::string> kGradSyncs = {"overlap", "after-backward"};
const std::vector<std::string> kGradDtypes = {"fp32", "bf16"};
const std::vector<std::string> kFp8Recipes = {"delayed", "current"};
const std::vector<std::string> kGradCompressions = {"none", "bf16", "fp16", "1bit"};
const std::vector<std::string> kOffloads = {"none", "optimizer", "params"};
const std::vector<std::string> kPlanFields = {"tp",        "pp",        "dp",           "cp",
                                              "ep",        "etp",       "vpp",       "zero",         "micro_batch",
                                              "global_batch", "seq_len", "recompute", "recompute_modules", "schedule",
                                              "precision", "sequence_parallel",
                                              "first_stage_layers", "last_stage_layers",
                                              "microbatches", "grad_bucket_mb", "grad_sync", "grad_dtype", "fp8_recipe",
                                              "fp8_param_gather", "cp_comm",
                                              "segments",
                                              "chunk_layers", "account_for_embedding_in_pipeline_split",
                                              "account_for_loss_in_pipeline_split", "grad_compression",
                                              "grad_compression_warmup", "error_feedback", "zero_reduce_once",
                                              "prefetch_across_chunks", "overlap_update", "tp_comm_overlap", "megatron_buckets",
                                              "moe_a2a_overlap", "overlap_p2p_comm", "offload"};

template <class E>
Result<E> parse_enum(const char* what, const std::string& s, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  return Error(unknown_name_message(what, s, names));
}

}  // namespace

std::string schedule_name(ScheduleKind s) { return std::string(schedule::schedule_kind_name(s)); }
std::string recompute_name(Recompute r) { return kRecomputes[static_cast<std::size_t>(r)]; }
std::string precision_name(Precision p) { return kPrecisions[static_cast<std::size_t>(p)]; }
Result<ScheduleKind> parse_schedule(const std::string& s) { return schedule::parse_schedule_kind(s); }
Result<Recompute> parse_recompute(const std::string& s) { return parse_enum<Recompute>("recompute mode", s, kRecomputes); }

std::vector<std::string> recompute_module_names(const RecomputeModules& r) {
  std::vector<std::string> out;
  if (r.layernorm) out.push_back("layernorm");
  if (r.moe_act) out.push_back("moe_act");
  return out;
}

Result<RecomputeModules> parse_recompute_modules(const std::vector<std::string>& names) {
  RecomputeModules r;
  for (const std::string& n : names) {
    if (n == "layernorm") r.layernorm = true;
    else if (n == "moe_act") r.moe_act = true;
    else if (n == "core_attn")
      return make_error("recompute module 'core_attn' is --recompute selective (the attention core); the modules "
                        "list takes layernorm and moe_act");
    else
      return make_error("unknown recompute module '{}': meshtrain recomputes layernorm and moe_act (Megatron-Core's "
                        "mla_up_proj, mlp, moe and shared_experts are not modelled; --recompute full recomputes "
                        "whole layers)",
                        n);
  }
  return r;
}
Result<Precision> parse_precision(const std::string& s) { return parse_enum<Precision>("precision", s, kPrecisions); }
std::string grad_sync_name(GradSync g) { return kGradSyncs[static_cast<std::size_t>(g)]; }
Result<GradSync> parse_grad_sync(const std::string& s) {
  return parse_enum<GradSync>("gradient sync mode", s, kGradSyncs);
}

std::string grad_dtype_name(GradDtype g) { return kGradDtypes[static_cast<std::size_t>(g)]; }
Result<GradDtype> parse_grad_dtype(const std::string& s) {
  return parse_enum<GradDtype>("gradient dtype", s, kGradDtypes);
}
std::string fp8_recipe_name(Fp8Recipe r) { return kFp8Recipes[static_cast<std::size_t>(r)]; }
Result<Fp8Recipe> parse_fp8_recipe(const std::string& s) { return parse_enum<Fp8Recipe>("FP8 recipe", s, kFp8Recipes); }
RecomputeModules effective_recompute_modules(const Plan& p) {
  return p.recompute == Recompute::full ? RecomputeModules{} : p.recompute_modules;
}

std::string recompute_label(const Plan& p) {
  const std::vector<std::string> modules = recompute_module_names(effective_recompute_modules(p));
  return recompute_name(p.recompute) + (modules.empty() ? "" : fmt::format("+{}", fmt::join(modules, ",")));
}
std::string precision_label(const Plan& p) {
  if (p.precision != Precision::fp8) return precision_name(p.precision);
  std::string s = "fp8";
  if (p.fp8_recipe == Fp8Recipe::current) s += " (current scaling)";
  if (p.fp8_param_gather) s += ", FP8 parameters";
  return s;
}
DType gradient_dtype(const Plan& p) { return p.grad_dtype == GradDtype::bf16 ? DType::bf16 : DType::f32; }
int gradient_bytes(const Plan& p) { return static_cast<int>(dtype_size(gradient_dtype(p))); }
std::string grad_dtype_note(const Plan& p) {
  return p.grad_dtype == GradDtype::fp32 ? "" : ", " + grad_dtype_name(p.grad_dtype) + " gradients";
}
double grad_bucket_elements(const Plan& p) { return p.grad_bucket_mb * (1 << 20) / 4; }

std::string grad_compression_name(GradCompression c) { return kGradCompressions[static_cast<std::size_t>(c)]; }
Result<GradCompression> parse_grad_compression(const std::string& s) {
  return parse_enum<GradCompression>("gradient compression", s, kGradCompressions);
}

std::string offload_name(Offload o) { return kOffloads[static_cast<std::size_t>(o)]; }
Result<Offload> parse_offload(const std::string& s) { return parse_enum<Offload>("offload mode", s, kOffloads); }

int element_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

int Plan::world_size() const {
  if (segments.empty()) return tp * pp * dp * cp;
  int world = 0;
  for (const Plan& s : segments) world = std::max(world, s.first_rank + s.world_size());
  return world;
}

const std::vector<PlanIntField>& plan_int_fields() {
  using O = PlanOverrides;
  constexpr IntRange kDegree{1, kMaxWorldSize};
  static const std::vector<PlanIntField> fields = {
      {"tp", "--tp", &O::tp, &Plan::tp, kDegree, "tensor-parallel size"},
      {"pp", "--pp", &O::pp, &Plan::pp, kDegree, "pipeline-parallel size"},
      {"dp", "--dp", &O::dp, &Plan::dp, kDegree, "data-parallel size"},
      {"cp", "--cp", &O::cp, &Plan::cp, kDegree, "context-parallel size"},
      {"ep", "--ep", &O::ep, &Plan::ep, kDegree, "expert-parallel size (divides dp; with --etp 1, tp·dp)"},
      {"etp", "--etp", &O::etp, &Plan::etp, {0, kMaxWorldSize},
       "expert tensor-parallel size: 1 (whole experts) or tp (0, the default)"},
      {"vpp", "--vpp", &O::vpp, &Plan::vpp, {1, 1 << 16}, "model chunks per pipeline stage (interleaved schedule)"},
      {"zero", "--zero", &O::zero, &Plan::zero, {0, 3}, "ZeRO stage 0-3"},
      {"micro_batch", "--micro-batch", &O::micro_batch, &Plan::micro_batch, {1, 1 << 20},
       "sequences per micro-batch"},
      {"global_batch", "--global-batch", &O::global_batch, &Plan::global_batch, {0, kMaxGlobalBatch},
       "sequences per iteration (default micro-batch x dp)"},
      {"microbatches", "--micro-batches", &O::microbatches, nullptr, {1, 1 << 20},
       "micro-batches per pipeline per iteration (sets the global batch)"},
      {"seq_len", "--seq-len", &O::seq_len, &Plan::seq_len, {0, 1 << 24}, "sequence length (default: the model's)"},
      {"first_stage_layers", "--first-stage-layers", &O::first_stage_layers, &Plan::first_stage_layers, {0, 1 << 16},
       "layers on the first pipeline stage (default 0: an even share)"},
      {"last_stage_layers", "--last-stage-layers", &O::last_stage_layers, &Plan::last_stage_layers, {0, 1 << 16},
       "layers on the last pipeline stage (default 0: an even share)"},
      {"grad_compression_warmup", "--grad-compression-warmup", &O::grad_compression_warmup,
       &Plan::grad_compression_warmup, {0, 1 << 30},
       "steps reduced uncompressed before --grad-compression starts (default 0)"},
  };
  return fields;
}

Result<PlanOverrides> plan_overrides_from_json(const nlohmann::json& j) {
  MT_ASSIGN(const JsonFields f,
            JsonFields::of(j, "plan field", "a plan must be a JSON object with fields such as tp, pp, dp"));
  MT_TRY(f.check_known(kPlanFields));
  PlanOverrides o;
  for (const PlanIntField& field : plan_int_fields()) MT_TRY(f.get_int(field.key, field.range, o.*field.member));
  MT_TRY(f.get_string("recompute", o.recompute));
  MT_TRY(f.get_string("schedule", o.schedule));
  MT_TRY(f.get_string("precision", o.precision));
  MT_TRY(f.get_string("grad_sync", o.grad_sync));
  MT_TRY(f.get_string("grad_dtype", o.grad_dtype));
  MT_TRY(f.get_string("fp8_recipe", o.fp8_recipe));
  MT_TRY(f.get_string("cp_comm", o.cp_comm));
  MT_TRY(f.get_real("grad_bucket_mb", kGradBucketMbRange, o.grad_bucket_mb));
  MT_TRY(f.get_bool("sequence_parallel", o.sequence_parallel));
  MT_TRY(f.get_bool("account_for_embedding_in_pipeline_split", o.embedding_in_split));
  MT_TRY(f.get_bool("account_for_loss_in_pipeline_split", o.loss_in_split));
  if (f.has("recompute_modules")) {
    const nlohmann::json& list = f.at("recompute_modules");
    std::vector<std::string> names;
    if (list.is_array())
      for (const nlohmann::json& v : list)
        if (v.is_string()) names.push_back(v.get<std::string>());
    if (!list.is_array() || names.size() != list.size())
      return make_error("{} must be a list of module names such as [\"layernorm\", \"moe_act\"], got {}",
                        f.name("recompute_modules"), json_excerpt(list));
    o.recompute_modules = std::move(names);
  }
  if (f.has("chunk_layers")) {
    const nlohmann::json& list = f.at("chunk_layers");
    if (!list.is_array() || list.size() > static_cast<std::size_t>(kMaxChunkLayers))
      return make_error("{} must be a list of at most {} layer counts (one per virtual stage), got {}",
                        f.name("chunk_layers"), kMaxChunkLayers, json_excerpt(list));
    std::vector<int> counts;
    for (const nlohmann::json& v : list) {
      MT_ASSIGN(const std::int64_t n, json_int(v, f.name("chunk_layers") + " entry", kChunkLayersRange));
      counts.push_back(static_cast<int>(n));
    }
    o.chunk_layers = std::move(counts);
  }
  MT_TRY(f.get_string("grad_compression", o.grad_compression));
  MT_TRY(f.get_bool("error_feedback", o.error_feedback));
  MT_TRY(f.get_bool("zero_reduce_once", o.zero_reduce_once));
  MT_TRY(f.get_bool("prefetch_across_chunks", o.prefetch_across_chunks));
  MT_TRY(f.get_bool("overlap_update", o.overlap_update));
  MT_TRY(f.get_bool("megatron_buckets", o.megatron_buckets));
  MT_TRY(f.get_bool("tp_comm_overlap", o.tp_comm_overlap));
  MT_TRY(f.get_bool("moe_a2a_overlap", o.moe_a2a_overlap));
  MT_TRY(f.get_bool("fp8_param_gather", o.fp8_param_gather));
  MT_TRY(f.get_bool("overlap_p2p_comm", o.overlap_p2p_comm));
  MT_TRY(f.get_string("offload", o.offload));
  if (f.has("segments")) o.segments = std::make_shared<const nlohmann::json>(j["segments"]);
  return o;
}

Result<PlanOverrides> plan_overrides_from_file(const std::string& path) {
  MT_ASSIGN(const nlohmann::json j, load_json_file(path, "plan file"));
  auto o = plan_overrides_from_json(j);
  o.context(fmt::format("plan file '{}'", path));
  return o;
}

Result<Plan> apply_overrides(Plan p, const PlanOverrides& o) {
  for (const PlanIntField& f : plan_int_fields())
    if (f.field != nullptr && o.*f.member) p.*f.field = *(o.*f.member);
  using O = PlanOverrides;
  static constexpr std::pair<std::optional<bool> O::*, bool Plan::*> kSwitches[] = {
      {&O::error_feedback, &Plan::error_feedback},
      {&O::zero_reduce_once, &Plan::zero_reduce_once},
      {&O::prefetch_across_chunks, &Plan::prefetch_across_chunks},
      {&O::overlap_update, &Plan::overlap_update},
      {&O::megatron_buckets, &Plan::megatron_buckets},
      {&O::tp_comm_overlap, &Plan::tp_comm_overlap},
      {&O::moe_a2a_overlap, &Plan::moe_a2a_overlap},
      {&O::fp8_param_gather, &Plan::fp8_param_gather},
      {&O::overlap_p2p_comm, &Plan::overlap_p2p_comm},
      {&O::sequence_parallel, &Plan::sequence_parallel},
      {&O::embedding_in_split, &Plan::embedding_in_split},
      {&O::loss_in_split, &Plan::loss_in_split}};
  for (const auto& [given, field] : kSwitches)
    if (o.*given) p.*field = *(o.*given);
  // A field given by name: parsed (an unknown name is refused with the nearest known one) and set.
  auto named = [](auto& field, const std::optional<std::string>& name, auto parse) -> Status {
    if (!name) return ok_status();
    MT_ASSIGN(field, parse(*name));
    return ok_status();
  };
  MT_TRY(named(p.grad_compression, o.grad_compression, parse_grad_compression));
  MT_TRY(named(p.offload, o.offload, parse_offload));
  MT_TRY(named(p.recompute, o.recompute, parse_recompute));
  MT_TRY(named(p.schedule, o.schedule, parse_schedule));
  MT_TRY(named(p.precision, o.precision, parse_precision));
  MT_TRY(named(p.grad_sync, o.grad_sync, parse_grad_sync));
  MT_TRY(named(p.grad_dtype, o.grad_dtype, parse_grad_dtype));
  MT_TRY(named(p.fp8_recipe, o.fp8_recipe, parse_fp8_recipe));
  MT_TRY(named(p.cp_comm, o.cp_comm, parse_context_comm));
  if (o.grad_bucket_mb) p.grad_bucket_mb = *o.grad_bucket_mb;
  if (o.chunk_layers) p.chunk_layers = *o.chunk_layers;
  if (o.recompute_modules) {
    MT_ASSIGN(p.recompute_modules, parse_recompute_modules(*o.recompute_modules));
  }
  if (o.microbatches) {
    if (*o.microbatches <= 0) return make_error("microbatches must be positive, got {}", *o.microbatches);
    const std::int64_t global = std::int64_t{p.micro_batch} * p.dp * *o.microbatches;
    if (global > kMaxGlobalBatch)
      return make_error("micro_batch·dp·microbatches = {}·{}·{} = {} sequences per iteration; the most is {}",
                        p.micro_batch, p.dp, *o.microbatches, global, kMaxGlobalBatch);
    if (o.global_batch && *o.global_batch != global)
      return make_error("global batch {} and {} micro-batches disagree: micro_batch·dp·microbatches = {}·{}·{} = {}; "
                        "give one of them", *o.global_batch, *o.microbatches, p.micro_batch, p.dp, *o.microbatches,
                        global);
    p.global_batch = static_cast<int>(global);
  }
  return p;
}


nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j = {{"tp", p.tp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"cp", p.cp},
          {"ep", p.ep},
          {"vpp", p.vpp},
          {"zero", p.zero},
          {"micro_batch", p.micro_batch},
          {"global_batch", p.effective_global_batch()},
          {"microbatches", p.microbatches()},
          {"seq_len", p.seq_len},
          {"recompute", recompute_name(p.recompute)},
          {"schedule", schedule_name(p.schedule)},
          {"precision", precision_name(p.precision)},
          {"sequence_parallel", p.sequence_parallel},
          {"world_size", p.world_size()}};
  // Only when set, so plans (and checkpoints) from before these fields read the same.
  if (p.first_stage_layers != 0) j["first_stage_layers"] = p.first_stage_layers;
  if (p.last_stage_layers != 0) j["last_stage_layers"] = p.last_stage_layers;
  if (p.grad_bucket_mb != Plan{}.grad_bucket_mb) j["grad_bucket_mb"] = p.grad_bucket_mb;
  if (p.grad_sync != GradSync::overlap) j["grad_sync"] = grad_sync_name(p.grad_sync);
  if (p.grad_dtype != GradDtype::fp32) j["grad_dtype"] = grad_dtype_name(p.grad_dtype);
  if (p.fp8_recipe != Fp8Recipe::delayed) j["fp8_recipe"] = fp8_recipe_name(p.fp8_recipe);
  if (p.cp_comm != ContextComm::all_gather) j["cp_comm"] = context_comm_name(p.cp_comm);
  if (!p.chunk_layers.empty()) j["chunk_layers"] = p.chunk_layers;
  if (p.recompute_modules.any()) j["recompute_modules"] = recompute_module_names(p.recompute_modules);
  if (p.embedding_in_split) j["account_for_embedding_in_pipeline_split"] = true;
  if (p.loss_in_split) j["account_for_loss_in_pipeline_split"] = true;
  if (p.grad_compression != GradCompression::none) {
    j["grad_compression"] = grad_compression_name(p.grad_compression);
    j["grad_compression_warmup"] = p.grad_compression_warmup;
    if (p.grad_compression == GradCompression::one_bit) j["error_feedback"] = p.error_feedback;
  }
  if (p.zero_reduce_once) j["zero_reduce_once"] = true;
  if (!p.prefetch_across_chunks) j["prefetch_across_chunks"] = false;
  if (p.overlap_update) j["overlap_update"] = true;
  if (p.megatron_buckets) j["megatron_buckets"] = true;
  if (p.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (p.moe_a2a_overlap) j["moe_a2a_overlap"] = true;
  if (p.fp8_param_gather) j["fp8_param_gather"] = true;
  if (p.overlap_p2p_comm) j["overlap_p2p_comm"] = true;
  if (p.offload != Offload::none) j["offload"] = offload_name(p.offload);
  if (!p.segments.empty()) {
    j["segments"] = nlohmann::json::array();
    for (const Plan& s : p.segments) {
      nlohmann::json seg = plan_to_json(s);
      seg["name"] = s.segment_name;
      seg["first_rank"] = s.first_rank;
      seg["first_layer"] = s.first_layer;
      seg["layers"] = s.layers;
      seg["embedding"] = s.embedding;
      seg["head"] = s.head;
      j["segments"].push_back(std::move(seg));
    }
  }
  if (p.etp != 0) j["etp"] = p.etp;
  return j;
}

}  // namespace meshtrain
