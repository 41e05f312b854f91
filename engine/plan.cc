#include "engine/plan.h"

#include <algorithm>

#include "engine/segments/segment_plan.h"
#include "models/block.h"
#include "models/model_tables.h"

#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "core/names.h"

namespace meshtrain {

namespace {

// Data-parallel gradient buckets of one rank (ZeRO 0/1): far more than any
// sensible --grad-bucket-mb gives, far fewer than would exhaust memory.
constexpr double kMaxGradBuckets = 1 << 18;

const std::vector<std::string> kRecomputes = {"none", "selective", "full"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kGradSyncs = {"overlap", "after-backward"};
const std::vector<std::string> kGradCompressions = {"none", "bf16", "fp16", "1bit"};
const std::vector<std::string> kOffloads = {"none", "optimizer", "params"};
const std::vector<std::string> kPlanFields = {"tp",        "pp",        "dp",           "cp",
                                              "ep",        "etp",       "vpp",       "zero",         "micro_batch",
                                              "global_batch", "seq_len", "recompute",   "schedule",
                                              "precision", "sequence_parallel",
                                              "first_stage_layers", "last_stage_layers",
                                              "microbatches", "grad_bucket_mb", "grad_sync", "cp_comm", "segments",
                                              "chunk_layers", "account_for_embedding_in_pipeline_split",
                                              "account_for_loss_in_pipeline_split", "grad_compression",
                                              "grad_compression_warmup", "error_feedback", "zero_reduce_once",
                                              "prefetch_across_chunks", "overlap_update", "tp_comm_overlap", "megatron_buckets",
                                              "offload"};

template <class E>
Result<E> parse_enum(const char* what, const std::string& s, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  return Error(unknown_name_message(what, s, names));
}

// Expert parallelism (engine/mesh.h's expert mesh) on an MoE model.
Status validate_expert_plan(const Plan& p, const ModelSpec& m) {
  const int etp = p.expert_tp();
  if (p.etp < 0 || (etp != 1 && etp != p.tp))
    return make_error("etp {} must be 1 (whole experts) or tp {} (experts split like the dense MLP)", p.etp, p.tp);
  if (m.experts % p.ep != 0)
    return make_error("experts {} are not divisible by ep {}; use an ep that divides {}", m.experts, p.ep,
                      m.experts);
  if (etp == p.tp && p.dp % p.ep != 0)
    return make_error("ep {} must divide dp {}: expert parallel groups are carved out of the data-parallel ranks "
                      "(tp·pp·dp = {}·{}·{} = {} ranks); use an ep that divides {}, or more data-parallel ranks",
                      p.ep, p.dp, p.tp, p.pp, p.dp, p.world_size(), p.dp);
  if (etp == 1 && (p.tp * p.dp) % p.ep != 0)
    return make_error("ep {} must divide tp·dp = {}·{} = {}: with etp 1 the expert groups take the tensor- and "
                      "data-parallel ranks of a stage; use an ep that divides {}",
                      p.ep, p.tp, p.dp, p.tp * p.dp, p.tp * p.dp);
  if (m.ffn % etp != 0)
    return make_error("expert ffn width {} is not divisible by etp {}; use etp 1 or a tp that divides {}", m.ffn,
                      etp, m.ffn);
  if (m.shared_experts > 0 && (m.ffn * m.shared_experts) % p.tp != 0)
    return make_error("shared experts' width {} (shared_experts {} · ffn {}) is not divisible by tp {}",
                      m.ffn * m.shared_experts, m.shared_experts, m.ffn, p.tp);
  const int rows = p.micro_batch * p.effective_seq_len(m);
  if (p.tp > 1 && rows % p.tp != 0)
    return make_error("each tp rank dispatches its share of a micro-batch's micro_batch·seq_len = {}·{} = {} tokens "
                      "to the experts, which tp {} does not divide",
                      p.micro_batch, p.effective_seq_len(m), rows, p.tp);
  return ok_status();
}

// Context parallelism (models/context_parallel.h) on a decoder.
Status validate_context_plan(const Plan& p, const ModelSpec& m, int seq) {
  if (m.vision())
    return make_error("context parallelism (cp {}) splits a decoder's sequence; the vision model '{}' has {} "
                      "tokens per image and a head that reads all of them: use cp 1",
                      p.cp, m.name, m.seq_len);
  if (m.moe())
    return make_error("context parallelism (cp {}) is not combined with experts yet (model '{}'): the expert "
                      "mesh would have to take the context ranks too; use cp 1 or a dense model",
                      p.cp, m.name);
  MT_TRY(check_context_split(seq, p.cp));
  if (p.sequence_parallel && (p.micro_batch * (seq / p.cp)) % p.tp != 0)
    return make_error("sequence parallelism splits a context rank's micro_batch·seq_len/cp = {}·{} rows over tp "
                      "{}, which does not divide them", p.micro_batch, seq / p.cp, p.tp);
  return ok_status();
}

}  // namespace

std::string schedule_name(ScheduleKind s) { return std::string(schedule::schedule_kind_name(s)); }
std::string recompute_name(Recompute r) { return kRecomputes[static_cast<std::size_t>(r)]; }
std::string precision_name(Precision p) { return kPrecisions[static_cast<std::size_t>(p)]; }
Result<ScheduleKind> parse_schedule(const std::string& s) { return schedule::parse_schedule_kind(s); }
Result<Recompute> parse_recompute(const std::string& s) { return parse_enum<Recompute>("recompute mode", s, kRecomputes); }
Result<Precision> parse_precision(const std::string& s) { return parse_enum<Precision>("precision", s, kPrecisions); }
std::string grad_sync_name(GradSync g) { return kGradSyncs[static_cast<std::size_t>(g)]; }
Result<GradSync> parse_grad_sync(const std::string& s) {
  return parse_enum<GradSync>("gradient sync mode", s, kGradSyncs);
}

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
      {"tp", "--tp", &O::tp, kDegree, "tensor-parallel size"},
      {"pp", "--pp", &O::pp, kDegree, "pipeline-parallel size"},
      {"dp", "--dp", &O::dp, kDegree, "data-parallel size"},
      {"cp", "--cp", &O::cp, kDegree, "context-parallel size"},
      {"ep", "--ep", &O::ep, kDegree, "expert-parallel size (divides dp; with --etp 1, tp·dp)"},
      {"etp", "--etp", &O::etp, {0, kMaxWorldSize}, "expert tensor-parallel size: 1 (whole experts) or tp (0, the default)"},
      {"vpp", "--vpp", &O::vpp, {1, 1 << 16}, "model chunks per pipeline stage (interleaved schedule)"},
      {"zero", "--zero", &O::zero, {0, 3}, "ZeRO stage 0-3"},
      {"micro_batch", "--micro-batch", &O::micro_batch, {1, 1 << 20}, "sequences per micro-batch"},
      {"global_batch", "--global-batch", &O::global_batch, {0, kMaxGlobalBatch},
       "sequences per iteration (default micro-batch x dp)"},
      {"microbatches", "--micro-batches", &O::microbatches, {1, 1 << 20},
       "micro-batches per pipeline per iteration (sets the global batch)"},
      {"seq_len", "--seq-len", &O::seq_len, {0, 1 << 24}, "sequence length (default: the model's)"},
      {"first_stage_layers", "--first-stage-layers", &O::first_stage_layers, {0, 1 << 16},
       "layers on the first pipeline stage (default 0: an even share)"},
      {"last_stage_layers", "--last-stage-layers", &O::last_stage_layers, {0, 1 << 16},
       "layers on the last pipeline stage (default 0: an even share)"},
      {"grad_compression_warmup", "--grad-compression-warmup", &O::grad_compression_warmup, {0, 1 << 30},
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
  MT_TRY(f.get_string("cp_comm", o.cp_comm));
  MT_TRY(f.get_real("grad_bucket_mb", kGradBucketMbRange, o.grad_bucket_mb));
  MT_TRY(f.get_bool("sequence_parallel", o.sequence_parallel));
  MT_TRY(f.get_bool("account_for_embedding_in_pipeline_split", o.embedding_in_split));
  MT_TRY(f.get_bool("account_for_loss_in_pipeline_split", o.loss_in_split));
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
  auto set = [](int& dst, const std::optional<int>& v) {
    if (v) dst = *v;
  };
  set(p.tp, o.tp);
  set(p.pp, o.pp);
  set(p.dp, o.dp);
  set(p.cp, o.cp);
  set(p.ep, o.ep);
  set(p.etp, o.etp);
  set(p.vpp, o.vpp);
  set(p.zero, o.zero);
  set(p.micro_batch, o.micro_batch);
  set(p.global_batch, o.global_batch);
  set(p.seq_len, o.seq_len);
  set(p.first_stage_layers, o.first_stage_layers);
  set(p.last_stage_layers, o.last_stage_layers);
  set(p.grad_compression_warmup, o.grad_compression_warmup);
  if (o.grad_compression) {
    MT_ASSIGN(p.grad_compression, parse_grad_compression(*o.grad_compression));
  }
  if (o.error_feedback) p.error_feedback = *o.error_feedback;
  if (o.zero_reduce_once) p.zero_reduce_once = *o.zero_reduce_once;
  if (o.prefetch_across_chunks) p.prefetch_across_chunks = *o.prefetch_across_chunks;
  if (o.overlap_update) p.overlap_update = *o.overlap_update;
  if (o.megatron_buckets) p.megatron_buckets = *o.megatron_buckets;
  if (o.tp_comm_overlap) p.tp_comm_overlap = *o.tp_comm_overlap;
  if (o.offload) {
    MT_ASSIGN(p.offload, parse_offload(*o.offload));
  }
  if (o.recompute) {
    MT_ASSIGN(p.recompute, parse_recompute(*o.recompute));
  }
  if (o.schedule) {
    MT_ASSIGN(p.schedule, parse_schedule(*o.schedule));
  }
  if (o.precision) {
    MT_ASSIGN(p.precision, parse_precision(*o.precision));
  }
  if (o.grad_sync) {
    MT_ASSIGN(p.grad_sync, parse_grad_sync(*o.grad_sync));
  }
  if (o.cp_comm) {
    MT_ASSIGN(p.cp_comm, parse_context_comm(*o.cp_comm));
  }
  if (o.grad_bucket_mb) p.grad_bucket_mb = *o.grad_bucket_mb;
  if (o.sequence_parallel) p.sequence_parallel = *o.sequence_parallel;
  if (o.embedding_in_split) p.embedding_in_split = *o.embedding_in_split;
  if (o.loss_in_split) p.loss_in_split = *o.loss_in_split;
  if (o.chunk_layers) p.chunk_layers = *o.chunk_layers;
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

Status validate_plan(const Plan& p, const ModelSpec& m, int world_size) {
  if (!p.segments.empty()) return validate_segments(p, m, world_size);
  struct Size {
    const char* name;
    int value;
  };
  for (Size s : {Size{"tp", p.tp}, Size{"pp", p.pp}, Size{"dp", p.dp}, Size{"cp", p.cp}, Size{"ep", p.ep},
                 Size{"vpp", p.vpp}, Size{"micro_batch", p.micro_batch}})
    if (s.value <= 0) return make_error("{} must be positive, got {}", s.name, s.value);
  // In doubles (2^20 four times over is past any integer type): the product is
  // checked before anything multiplies the degrees in int.
  const double world = static_cast<double>(p.tp) * p.pp * p.dp * p.cp;
  if (world > kMaxWorldSize)
    return make_error("tp·pp·dp·cp = {}·{}·{}·{} = {:.0f} ranks; the most meshtrain plans for is {}", p.tp, p.pp,
                      p.dp, p.cp, world, kMaxWorldSize);
  if (std::int64_t{p.micro_batch} * p.dp > kMaxGlobalBatch)
    return make_error("micro_batch·dp = {}·{} = {} sequences per iteration; the most is {}", p.micro_batch, p.dp,
                      std::int64_t{p.micro_batch} * p.dp, kMaxGlobalBatch);
  if (p.global_batch < 0) return make_error("global_batch must be positive, got {}", p.global_batch);
  if (p.seq_len < 0) return make_error("seq_len must be positive, got {}", p.seq_len);
  if (p.zero < 0 || p.zero > 3)
    return make_error("zero stage must be 0, 1, 2 or 3, got {}", p.zero);
  // The upper bound keeps the element count far from overflow; 1 TiB is larger than any stage's gradients.
  if (!in_range(p.grad_bucket_mb, kGradBucketMbRange))
    return make_error("grad_bucket_mb (--grad-bucket-mb) must be a positive number of MiB {}, got {}; "
                      "use e.g. 25 (PyTorch DDP's bucket_cap_mb) or leave it out for the engine's 4",
                      describe(kGradBucketMbRange), p.grad_bucket_mb);
  if (p.grad_compression == GradCompression::one_bit && p.zero >= 2)
    return make_error("grad_compression (--grad-compression) 1bit needs zero 0 or 1, got zero {}: ZeRO 2 and 3 "
                      "reduce each layer's gradients once per micro-batch, and the error feedback would need a "
                      "full-size error buffer per rank, the memory ZeRO 2 saves (DeepSpeed's 1-bit Adam refuses "
                      "them too); use --zero 1, or bf16/fp16 compression",
                      p.zero);
  if (p.zero_reduce_once && p.zero < 2)
    return make_error("zero_reduce_once (--zero-reduce-once) needs zero 2 or 3, got zero {}: ZeRO 0 and 1 "
                      "already reduce once per step; drop the flag or use --zero 2",
                      p.zero);
  if (p.offload == Offload::params && p.zero < 3)
    return make_error("offload (--offload) params needs zero 3, got zero {}: below ZeRO 3 every rank holds the "
                      "whole model's parameters for its forward and backward, so there are no shards to keep on the "
                      "host; use --zero 3, or --offload optimizer",
                      p.zero);
  if (p.offload != Offload::none && p.overlap_update)
    return make_error("overlap_update (--overlap-update) does not combine with offload (--offload) {}: the offloaded "
                      "update already runs off the compute stream, bucket by bucket on the host; drop one of them",
                      offload_name(p.offload));
  if (p.tp_comm_overlap && (p.tp == 1 || !p.sequence_parallel))
    return make_error("tp_comm_overlap (--tp-comm-overlap) needs tensor parallelism with sequence parallelism, got "
                      "tp {}{}: it pipelines the sequence-parallel all-gather before the column-parallel GEMMs; use "
                      "--tp 2 or more with --sequence-parallel, or drop the flag",
                      p.tp, p.sequence_parallel ? "" : " without sequence_parallel");
  if (p.grad_compression_warmup < 0)
    return make_error("grad_compression_warmup (--grad-compression-warmup) must be >= 0, got {}",
                      p.grad_compression_warmup);
  if (p.grad_sync == GradSync::after_backward && p.zero >= 2)
    return make_error("grad_sync (--grad-sync) after-backward needs zero 0 or 1, got zero {}: ZeRO 2 and 3 "
                      "reduce each layer's gradients during backward to free them; use --grad-sync overlap",
                      p.zero);
  if (world_size > 0 && world_size != p.world_size()) {
    const int model_parallel = p.tp * p.pp * p.cp;
    if (world_size % model_parallel != 0)
      return make_error("world size {} is not a multiple of tp·pp·cp = {}·{}·{} = {}; use a multiple of {} "
                        "ranks or change tp/pp/cp", world_size, p.tp, p.pp, p.cp, model_parallel, model_parallel);
    return make_error("world size {} != tp·pp·dp·cp = {}·{}·{}·{} = {}; set dp = {} or change tp/pp/cp",
                      world_size, p.tp, p.pp, p.dp, p.cp, p.world_size(), world_size / model_parallel);
  }
  if (m.vision()) {
    const std::shared_ptr<const ModelTables> tables = model_tables(m);
    // Every layer splits its own heads (a Swin stage's differ from the next's).
    for (const auto& block : tables->blocks)
      if (p.stage_split().holds(m, block->layer())) MT_TRY(block->check_tensor_parallel(p.tp));
    if (p.seq_len != 0 && p.seq_len != m.seq_len)
      return make_error("seq_len {} given for the vision model '{}', whose images make {} tokens; leave seq_len out",
                        p.seq_len, m.name, m.seq_len);
    if (p.sequence_parallel)
      for (const auto& block : tables->blocks)
        for (const std::int64_t tokens : {block->io(m.seq_len).tokens_in, block->io(m.seq_len).tokens_out})
          if (tokens > 1 && (p.micro_batch * tokens) % p.tp != 0)
            return make_error("sequence parallelism splits the micro_batch·tokens = {}·{} rows at layer {} over tp "
                              "{}, which does not divide them; choose a micro_batch that makes every layer's rows "
                              "a multiple of tp",
                              p.micro_batch, tokens, block->layer(), p.tp);
  } else {
    if (m.heads % p.tp != 0)
      return make_error("heads {} are not divisible by tp {}; use a tp that divides {}", m.heads, p.tp, m.heads);
    if (m.kv_heads % p.tp != 0)
      return make_error("kv_heads {} are not divisible by tp {}; use a tp that divides {}", m.kv_heads, p.tp,
                        m.kv_heads);
    // An MoE model's experts split over etp; its dense layers and shared experts over tp.
    const int mlp = m.moe() ? m.dense_mlp_width() : m.ffn;
    if (mlp % p.tp != 0)
      return make_error("ffn width {} is not divisible by tp {}; use a tp that divides {}", mlp, p.tp, mlp);
  }
  MT_TRY(check_stage_split(m, p.stage_split()));
  if (p.megatron_buckets && p.zero >= 2)
    return make_error("megatron_buckets (--megatron-buckets) sizes ZeRO 0/1 buckets, but zero is {}: ZeRO 2 and 3 "
                      "reduce one layer per bucket; drop it or use zero 0 or 1",
                      p.zero);
  if (p.zero <= 1 && !p.megatron_buckets) {
    // ZeRO 0 and 1 cut a rank's gradients into buckets of grad_bucket_mb (at
    // least dp elements); a tiny bucket would mean millions of collectives.
    const double per_rank = static_cast<double>(count_parameters(m).total) / (static_cast<double>(p.tp) * p.pp);
    const double bucket = std::max(p.grad_bucket_mb * (1 << 20) / 4, static_cast<double>(p.dp));
    if (per_rank / bucket > kMaxGradBuckets) {
      const double need_mb = per_rank / kMaxGradBuckets * 4 / (1 << 20);
      return make_error("grad_bucket_mb (--grad-bucket-mb) {} cuts about {:.3g} gradients per rank into {:.3g} "
                        "buckets, one collective each; the most is {}: {}",
                        p.grad_bucket_mb, per_rank, per_rank / bucket, kMaxGradBuckets,
                        need_mb <= kGradBucketMbRange.max
                            ? fmt::format("use --grad-bucket-mb {:.3g} or more", need_mb)
                            : std::string("use more tensor or pipeline parallelism, or --zero 2 or 3 (a bucket "
                                          "per layer)"));
    }
  }
  const int seq = p.effective_seq_len(m);
  if (seq > m.seq_len && m.position == PositionKind::learned)
    return make_error("seq_len {} exceeds the model's learned positions ({}); use seq_len <= {}", seq, m.seq_len,
                      m.seq_len);
  if (p.cp > 1) MT_TRY(validate_context_plan(p, m, seq));
  if (p.sequence_parallel && !m.vision() && seq % p.tp != 0)
    return make_error("sequence parallelism splits seq_len {} over tp {}, which does not divide it", seq, p.tp);
  const int per_step = p.micro_batch * p.dp;
  if (p.effective_global_batch() % per_step != 0)
    return make_error("global batch {} is not divisible by micro_batch·dp = {}·{} = {}; use a multiple of {}",
                      p.effective_global_batch(), p.micro_batch, p.dp, per_step, per_step);
  if (m.moe()) {
    MT_TRY(validate_expert_plan(p, m));
  } else if (p.ep != 1 || p.etp > 1) {
    return make_error("ep {} (etp {}) given for a dense model '{}' (no experts); use ep 1", p.ep, p.etp, m.name);
  }
  if (p.schedule == ScheduleKind::interleaved) {
    if (p.vpp < 2) return make_error("the interleaved schedule needs vpp >= 2 model chunks per stage, got vpp {}", p.vpp);
    if (p.pp < 2) return make_error("the interleaved schedule needs pp >= 2, got pp {}", p.pp);
    if (p.microbatches() % p.pp != 0)
      return make_error("the interleaved schedule needs micro-batches ({} = global batch {} / (micro_batch {} · dp "
                        "{})) to be a multiple of pp {}", p.microbatches(), p.effective_global_batch(),
                        p.micro_batch, p.dp, p.pp);
  } else if (p.vpp != 1) {
    return make_error("vpp {} needs the interleaved schedule (got {}); use --schedule interleaved or vpp 1", p.vpp,
                      schedule_name(p.schedule));
  }
  if (p.schedule == ScheduleKind::zb_h1 && p.zero >= 2)
    return make_error("the zb-h1 schedule computes weight gradients in passes after the backwards, while ZeRO {} "
                      "frees (and under 3 re-gathers) each layer's state around its backward; use --zero 0 or 1",
                      p.zero);
  return {};
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
  if (p.cp_comm != ContextComm::all_gather) j["cp_comm"] = context_comm_name(p.cp_comm);
  if (!p.chunk_layers.empty()) j["chunk_layers"] = p.chunk_layers;
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
