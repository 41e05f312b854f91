// validate_plan (plan.h): every rule a plan must satisfy before anything
// runs, as named steps in the order a user meets them: degrees, the features
// that need each other, the world size, how the model splits, buckets,
// sequence and batch, experts, schedule. What a rule asks of the model comes
// from the model's own description (its blocks, models/model_io.h), not from
// which kind of model it is.
#include "engine/plan/plan.h"

#include <algorithm>

#include "core/bounded.h"
#include "engine/plan/segment_plan.h"
#include "models/block.h"
#include "models/model_io.h"
#include "models/model_tables.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

// Data-parallel gradient buckets of one rank (ZeRO 0/1): far more than any
// sensible --grad-bucket-mb gives, far fewer than would exhaust memory.
constexpr double kMaxGradBuckets = 1 << 18;

Status check_degrees(const Plan& p) {
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
  if (p.zero < 0 || p.zero > 3) return make_error("zero stage must be 0, 1, 2 or 3, got {}", p.zero);
  // The upper bound keeps the element count far from overflow; 1 TiB is larger than any stage's gradients.
  if (!in_range(p.grad_bucket_mb, kGradBucketMbRange))
    return make_error("grad_bucket_mb (--grad-bucket-mb) must be a positive number of MiB {}, got {}; "
                      "use e.g. 25 (PyTorch DDP's bucket_cap_mb) or leave it out for the engine's 4",
                      describe(kGradBucketMbRange), p.grad_bucket_mb);
  if (p.grad_compression_warmup < 0)
    return make_error("grad_compression_warmup (--grad-compression-warmup) must be >= 0, got {}",
                      p.grad_compression_warmup);
  return ok_status();
}

}  // namespace

Status check_fp8_recipe(const Plan& p) {
  if (p.fp8_recipe == Fp8Recipe::delayed || p.precision == Precision::fp8) return ok_status();
  return make_error("fp8_recipe (--fp8-recipe) {} scales FP8 tensors, but the plan's precision is {}: add "
                    "--precision fp8, or drop the recipe",
                    fp8_recipe_name(p.fp8_recipe), precision_name(p.precision));
}

// What EP all-to-all overlap pairs: a steady state of forwards and backwards of
// different micro-batches, each whole (Megatron-Core's asserts, and ours: ZeRO 3
// gathers a layer's parameters for one pass at a time).
Status check_a2a_overlap(const Plan& p) {
  if (!p.moe_a2a_overlap) return ok_status();
  if (p.ep == 1)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) needs expert parallelism, got ep 1: it hides the "
                      "experts' token all-to-alls; set --ep 2 or more, or drop the flag");
  if (p.schedule == ScheduleKind::one_f_one_b && p.pp > 1)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) with pp {} needs the interleaved schedule, as "
                      "Megatron-Core requires virtual pipeline stages for it; use --schedule interleaved --vpp 2 "
                      "or more, or pp 1",
                      p.pp);
  if (p.schedule != ScheduleKind::one_f_one_b && p.schedule != ScheduleKind::interleaved)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) needs the 1f1b or interleaved schedule, got {}: it "
                      "pairs each steady-state forward with a whole backward; use --schedule 1f1b (pp 1) or "
                      "interleaved",
                      schedule_kind_name(p.schedule));
  if (p.recompute == Recompute::full)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) does not combine with recompute full: a recomputed "
                      "layer's forward would run inside the paired backward (Megatron-Core refuses it too); use "
                      "--recompute selective or none");
  if (p.zero >= 3)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) needs zero 0, 1 or 2, got zero {}: ZeRO 3 gathers a "
                      "layer's parameters for one pass at a time, and the paired passes run two layers at once; "
                      "use --zero 1 (Megatron's distributed optimizer)",
                      p.zero);
  return ok_status();
}

namespace {

// Features that need another feature, or exclude one.
Status check_feature_combinations(const Plan& p) {
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
  if (p.grad_dtype == GradDtype::bf16 && p.precision != Precision::bf16 && p.precision != Precision::fp8)
    return make_error("grad_dtype (--grad-dtype) bf16 needs precision bf16 or fp8, got {}: the gradients are kept in "
                      "the 16-bit working dtype of the weights; use --precision bf16, or --grad-dtype fp32",
                      precision_name(p.precision));
  MT_TRY(check_fp8_recipe(p));
  if (p.overlap_p2p_comm && (p.pp == 1 || p.schedule != ScheduleKind::interleaved))
    return make_error("overlap_p2p_comm (--overlap-p2p-comm) needs the interleaved schedule with pp > 1, got {} with "
                      "pp {}: Megatron-Core overlaps pipeline communication in that schedule only; use --schedule "
                      "interleaved with --pp 2 or more, or drop the flag",
                      schedule_name(p.schedule), p.pp);
  if (p.fp8_param_gather && p.precision != Precision::fp8)
    return make_error("fp8_param_gather (--fp8-param-gather) needs precision fp8, got {}: it keeps the weights of "
                      "the FP8 linears as FP8 parameters; use --precision fp8, or drop the flag",
                      precision_name(p.precision));
  if (p.fp8_param_gather && p.zero == 0)
    return make_error("fp8_param_gather (--fp8-param-gather) needs the distributed optimizer, zero 1, 2 or 3, got "
                      "zero 0: each rank casts its master shard to FP8 and the shards are all-gathered "
                      "(Megatron-Core asserts --use-distributed-optimizer with it); use --zero 1, or drop the flag");
  if (p.grad_dtype == GradDtype::bf16 && p.grad_compression != GradCompression::none)
    return make_error("grad_dtype (--grad-dtype) bf16 does not combine with grad_compression (--grad-compression) {}: "
                      "the compressors read and write fp32 gradients; drop one of them",
                      grad_compression_name(p.grad_compression));
  if (p.grad_sync == GradSync::after_backward && p.zero >= 2)
    return make_error("grad_sync (--grad-sync) after-backward needs zero 0 or 1, got zero {}: ZeRO 2 and 3 "
                      "reduce each layer's gradients during backward to free them; use --grad-sync overlap",
                      p.zero);
  return ok_status();
}

Status check_world_size(const Plan& p, int world_size) {
  if (world_size <= 0 || world_size == p.world_size()) return ok_status();
  const int model_parallel = p.tp * p.pp * p.cp;
  if (world_size % model_parallel != 0)
    return make_error("world size {} is not a multiple of tp·pp·cp = {}·{}·{} = {}; use a multiple of {} "
                      "ranks or change tp/pp/cp", world_size, p.tp, p.pp, p.cp, model_parallel, model_parallel);
  return make_error("world size {} != tp·pp·dp·cp = {}·{}·{}·{} = {}; set dp = {} or change tp/pp/cp",
                    world_size, p.tp, p.pp, p.dp, p.cp, p.world_size(), world_size / model_parallel);
}

// Every block the plan holds splits over tp (its heads, its MLP), and under
// sequence parallelism tp divides the rows entering and leaving it.
Status check_model_split(const Plan& p, const ModelSpec& m, const ModelIo& io) {
  if (io.tokens_fixed_by_model && p.seq_len != 0 && p.seq_len != m.seq_len)
    return make_error("seq_len {} given for the {} '{}', which reads {} that make {} tokens; leave seq_len out",
                      p.seq_len, io.noun(), m.name, io.describe(), m.seq_len);
  const std::shared_ptr<const ModelTables> tables = model_tables(m);
  // Every layer splits its own heads (a Swin stage's differ from the next's).
  for (const auto& block : tables->blocks)
    if (p.stage_split().holds(m, block->layer())) MT_TRY(block->check_tensor_parallel(p.tp));
  if (!p.sequence_parallel) return ok_status();
  const int seq = p.effective_seq_len(m);
  // A sequence the run chooses is split evenly over tp; every block's rows must divide too.
  if (!io.tokens_fixed_by_model && seq % p.tp != 0)
    return make_error("sequence parallelism splits seq_len {} over tp {}, which does not divide it", seq, p.tp);
  for (const auto& block : tables->blocks)
    for (const std::int64_t tokens : {block->io(seq).tokens_in, block->io(seq).tokens_out})
      if (tokens > 1 && (p.micro_batch * tokens) % p.tp != 0)
        return make_error("sequence parallelism splits the micro_batch·tokens = {}·{} rows at layer {} over tp "
                          "{}, which does not divide them; choose a micro_batch that makes every layer's rows "
                          "a multiple of tp",
                          p.micro_batch, tokens, block->layer(), p.tp);
  return ok_status();
}

// ZeRO 0 and 1 cut a rank's gradients into buckets of grad_bucket_mb (at
// least dp elements); a tiny bucket would mean millions of collectives.
Status check_buckets(const Plan& p, const ModelSpec& m) {
  if (p.megatron_buckets && p.zero >= 2)
    return make_error("megatron_buckets (--megatron-buckets) sizes ZeRO 0/1 buckets, but zero is {}: ZeRO 2 and 3 "
                      "reduce one layer per bucket; drop it or use zero 0 or 1",
                      p.zero);
  // Megatron's rule sizes its own buckets (at least 40M parameters each).
  if (p.zero > 1 || p.megatron_buckets) return ok_status();
  const double per_rank = static_cast<double>(count_parameters(m).total) / (static_cast<double>(p.tp) * p.pp);
  const double bucket = std::max(p.grad_bucket_mb * (1 << 20) / 4, static_cast<double>(p.dp));
  if (per_rank / bucket <= kMaxGradBuckets) return ok_status();
  const double need_mb = per_rank / kMaxGradBuckets * 4 / (1 << 20);
  return make_error("grad_bucket_mb (--grad-bucket-mb) {} cuts about {:.3g} gradients per rank into {:.3g} "
                    "buckets, one collective each; the most is {}: {}",
                    p.grad_bucket_mb, per_rank, per_rank / bucket, kMaxGradBuckets,
                    need_mb <= kGradBucketMbRange.max
                        ? fmt::format("use --grad-bucket-mb {:.3g} or more", need_mb)
                        : std::string("use more tensor or pipeline parallelism, or --zero 2 or 3 (a bucket "
                                      "per layer)"));
}

// Expert parallelism (engine/plan/mesh.h's expert mesh) on an MoE model.
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

// Context parallelism (models/context_parallel.h): a sequence the run chooses, split over cp.
Status validate_context_plan(const Plan& p, const ModelSpec& m, const ModelIo& io, int seq) {
  if (io.tokens_fixed_by_model)
    return make_error("context parallelism (cp {}) splits a decoder's sequence; the {} '{}' reads {} of {} "
                      "tokens each and a head that reads all of them: use cp 1",
                      p.cp, io.noun(), m.name, io.describe(), m.seq_len);
  if (io.routes_to_experts)
    return make_error("context parallelism (cp {}) is not combined with experts yet (model '{}'): the expert "
                      "mesh would have to take the context ranks too; use cp 1 or a dense model",
                      p.cp, m.name);
  // A ring block pairs chunks by index, not position: a window would cut inside an earlier key chunk.
  if (p.cp_comm == ContextComm::ring && m.sliding_window > 0)
    return make_error("ring attention (cp {}) does not mask a sliding window across chunks (model '{}' has "
                      "sliding_window {}); use --cp-comm all_gather, whose query windows mask by position",
                      p.cp, m.name, m.sliding_window);
  MT_TRY(check_context_split(seq, p.cp));
  if (p.sequence_parallel && (p.micro_batch * (seq / p.cp)) % p.tp != 0)
    return make_error("sequence parallelism splits a context rank's micro_batch·seq_len/cp = {}·{} rows over tp "
                      "{}, which does not divide them", p.micro_batch, seq / p.cp, p.tp);
  return ok_status();
}


// The sequence the model reads, and the global batch in whole micro-batches.
Status check_sequence_and_batch(const Plan& p, const ModelSpec& m, const ModelIo& io) {
  const int seq = p.effective_seq_len(m);
  if (seq > m.seq_len && m.position == PositionKind::learned)
    return make_error("seq_len {} exceeds the model's learned positions ({}); use seq_len <= {}", seq, m.seq_len,
                      m.seq_len);
  if (p.cp > 1) MT_TRY(validate_context_plan(p, m, io, seq));
  const int per_step = p.micro_batch * p.dp;
  if (p.effective_global_batch() % per_step != 0)
    return make_error("global batch {} is not divisible by micro_batch·dp = {}·{} = {}; use a multiple of {}",
                      p.effective_global_batch(), p.micro_batch, p.dp, per_step, per_step);
  return ok_status();
}

Status check_experts(const Plan& p, const ModelSpec& m, const ModelIo& io) {
  if (io.routes_to_experts) {
    MT_TRY(check_a2a_overlap(p));
    return validate_expert_plan(p, m);
  }
  if (p.moe_a2a_overlap)
    return make_error("moe_a2a_overlap (--moe-a2a-overlap) given for a dense model '{}' (no experts, so no "
                      "all-to-alls to hide); drop the flag",
                      m.name);
  if (p.ep != 1 || p.etp > 1)
    return make_error("ep {} (etp {}) given for a dense model '{}' (no experts); use ep 1", p.ep, p.etp, m.name);
  if (p.recompute_modules.any())
    return make_error("recompute module {} recomputes {}, and model '{}' has no experts; drop it from "
                      "--recompute-modules",
                      p.recompute_modules.moe_act ? "moe_act" : "layernorm",
                      p.recompute_modules.moe_act ? "the routed experts' activation"
                                                  : "an MoE layer's pre-MLP norm (Transformer Engine fuses a dense "
                                                    "layer's norms into its linear layers, leaving none to recompute)",
                      m.name);
  return ok_status();
}

Status check_schedule(const Plan& p) {
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
  return ok_status();
}

}  // namespace

Status validate_plan(const Plan& p, const ModelSpec& m, int world_size) {
  if (!p.segments.empty()) return validate_segments(p, m, world_size);
  MT_TRY(check_degrees(p));
  MT_TRY(check_feature_combinations(p));
  MT_TRY(check_world_size(p, world_size));
  const ModelIo io = model_io(m, p.effective_seq_len(m));
  MT_TRY(check_model_split(p, m, io));
  MT_TRY(check_stage_split(m, p.stage_split()));
  MT_TRY(check_buckets(p, m));
  MT_TRY(check_sequence_and_batch(p, m, io));
  MT_TRY(check_experts(p, m, io));
  return check_schedule(p);
}

}  // namespace meshtrain
