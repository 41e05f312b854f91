// Plan: how one training job is parallelised, as a value.
//
// Read from a JSON file (field names as below) and from command-line flags,
// flags overriding the file. `validate_plan` rejects every plan that does not
// divide before anything runs, with a message that names the numbers and
// what would fix them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/bounded.h"
#include "core/fp8.h"
#include "core/status.h"
#include "engine/schedule/builders.h"
#include "models/context_parallel.h"
#include "models/flops.h"
#include "models/model_spec.h"
#include "models/parameters.h"

namespace meshtrain {

// The schedule library's enum (engine/schedule/builders.h), so a plan's
// schedule goes to build_schedule as it is.
using schedule::ScheduleKind;
// fp8: bf16 training whose linear layers' GEMMs take FP8 operands (E4M3
// forward, E5M2 gradients, per-tensor delayed scaling; Transformer Engine's
// recipe, engine/plan/fp8_recipe.h). Simulated; trained on cpu as emulation.
enum class Precision { fp32, bf16, fp16, fp8 };
// When the data-parallel gradient buckets are reduced: `overlap` issues each
// bucket as soon as the last micro-batch's backward has completed it (PyTorch
// DDP, Megatron's --DDP-impl torch); `after_backward` issues every bucket once
// the whole pipeline schedule has run (Megatron's --DDP-impl local, which
// all-reduces its contiguous gradient buffer after backward).
enum class GradSync { overlap, after_backward };
// What the gradient buffers hold: fp32 (Megatron's main_grad with
// --accumulate-allreduce-grads-in-fp32, which Megatron-LM sets with --bf16),
// or the 16-bit working dtype (Megatron-Core's grad_reduce_in_fp32 = False,
// which NeMo's and Megatron-Bridge's recipes set): micro-batches accumulate
// into it and data parallelism reduces it at half the bytes.
enum class GradDtype { fp32, bf16 };
// How data-parallel gradient buckets travel (engine/parallel/grad_compression.h):
// as they are (fp32), cast to bf16 or fp16 for the wire (PyTorch DDP's
// compress hooks), or as signs with one scale per chunk and error feedback
// (1-bit Adam, EF-SGD).
enum class GradCompression { none, bf16, fp16, one_bit };
// Where the optimizer lives (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity,
// Rajbhandari et al. 2021): on the device; `optimizer`: fp32 master weights
// and AdamW moments in host memory, updated there by the host's cores from
// gradients copied over PCIe (sharded_optimizer.h); `params` (ZeRO 3): also
// the parameter shards, fetched to the device before each layer's gather
// (parameter_gather.h).
enum class Offload { none, optimizer, params };

struct Plan {
  int tp = 1;   // tensor parallel
  int pp = 1;   // pipeline parallel
  int dp = 1;   // data parallel
  int cp = 1;   // context parallel (sequence split across ranks, models/context_parallel.h)
  // How a context-parallel attention gathers keys and values: all-gather
  // (Llama 3) or a ring of send/recv.
  ContextComm cp_comm = ContextComm::all_gather;
  int ep = 1;   // expert parallel, carved out of the data-parallel ranks (engine/plan/mesh.h)
  // Expert tensor parallel: how many ranks split each expert's matrices, 1
  // or tp; 0 means tp (Megatron-Core's default).
  int etp = 0;
  int vpp = 1;  // model chunks per pipeline stage (interleaving)
  int zero = 0; // ZeRO stage 0..3 over the data-parallel group
  int micro_batch = 1;
  int global_batch = 0;  // 0: micro_batch · dp (one micro-batch per rank)
  int seq_len = 0;       // 0: the model's seq_len
  Recompute recompute = Recompute::none;
  // Megatron-Core's --recompute-modules other than the attention core (which
  // recompute selective stands for): recomputed in backward, their outputs
  // freed after forward (models/block.h ChunkOptions).
  RecomputeModules recompute_modules;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  Precision precision = Precision::bf16;
  bool sequence_parallel = false;
  // Layers on the first / last pipeline stage; 0: an even share. The other
  // stages share the remaining layers evenly (models/parameters.h StageSplit,
  // as Megatron-Core's --decoder-first/last-pipeline-num-layers).
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // Flexible layouts (models/parameters.h StageSplit): every virtual stage's
  // layers, or Megatron-Core's accounting of the embedding and the loss as
  // layers of the split.
  std::vector<int> chunk_layers;
  bool embedding_in_split = false, loss_in_split = false;
  // Data-parallel gradient bucket under ZeRO 0 and 1: MiB of the flat fp32
  // gradient buffer per all-reduce (reduce-scatter under ZeRO 1), MiB as in
  // PyTorch DDP's bucket_cap_mb (default 25). ZeRO 2 and 3 reduce one layer
  // per bucket and ignore it. The default 4 MiB (1 Mi gradient elements) is
  // the size the engine used before the bucket was a plan fact, kept so that
  // earlier runs, tests and simulated tables reproduce; it is not a measured
  // optimum. Smaller buckets overlap more of backward but pay a collective's
  // latency each, which over many nodes can dominate (experiments/RESULTS.md,
  // "Table 1 with each row's DDP implementation").
  double grad_bucket_mb = 4;
  // Megatron-Core's buckets instead (DistributedDataParallel, r0.8 to today):
  // max(40M, 1M·dp) parameters per bucket on the first pipeline stage's
  // first model chunk, and one bucket per model chunk everywhere else (its
  // gradients are not on the critical path there); grad_bucket_mb is unused.
  bool megatron_buckets = false;
  GradSync grad_sync = GradSync::overlap;
  GradDtype grad_dtype = GradDtype::fp32;
  // Under precision fp8, how each FP8 tensor gets its scale (core/fp8.h):
  // delayed (Transformer Engine's DelayedScaling, Megatron's --fp8-recipe
  // delayed) or current (Float8CurrentScaling, --fp8-recipe tensorwise,
  // NeMo's fp8_cs: an amax pass before every cast).
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;
  // Under precision fp8 and ZeRO 1-3, the FP8 linears' weights are FP8
  // parameters (Megatron-Core's --fp8-param-gather, Transformer Engine's
  // fp8_model_init): the optimizer casts each rank's fp32 master shard
  // straight to FP8, the data-parallel all-gather moves them at one byte an
  // element, and no 16-bit copy of them is kept (engine/plan/fp8_recipe.h).
  // Simulated only: the cpu emulation keeps every parameter in its working
  // dtype, so train refuses it.
  bool fp8_param_gather = false;
  GradCompression grad_compression = GradCompression::none;
  // Steps whose gradients are reduced uncompressed before compression starts
  // (1-bit Adam's warm-up: the first steps' large, fast-changing gradients
  // are the ones sign compression hurts most).
  int grad_compression_warmup = 0;
  // 1bit: each rank keeps its compression error and adds it to the next
  // step's gradients. Off only to measure what it is worth.
  bool error_feedback = true;
  // ZeRO 2/3 with several micro-batches: reduce-scatter each layer's
  // gradients after every micro-batch's backward (false: the rank holds only
  // its shard and the layers backward is in) or once per step after the
  // micro-batches accumulated locally (true: one reduce-scatter per step, as
  // ZeRO 1, for a whole unsharded gradient held during backward).
  bool zero_reduce_once = false;
  // ZeRO 3: at the end of a chunk's forward or backward, prefetch the
  // parameters of the first layer of the rank's next compute action in the
  // schedule (another chunk, or the next micro-batch) instead of waiting for
  // that action to start (false: prefetch within a pass only).
  bool prefetch_across_chunks = true;
  // The optimizer off the critical path: each gradient bucket's AdamW update
  // (and ZeRO 1/2 parameter all-gather) runs on the data-parallel stream, and
  // the next iteration's forward of a layer waits only for its own buckets'
  // updates. Without clipping a bucket updates as soon as its reduction is
  // issued (during backward); with clipping the updates wait for the global
  // norm and run in forward order (step_engine.h says what a non-finite step
  // then leaves behind).
  bool overlap_update = false;
  // Sequence parallelism's all-gather before a column-parallel GEMM (QKV,
  // MLP-up) pipelined with the GEMM, as Megatron's tp-comm-overlap does:
  // tp-1 ring steps of send/recv on a side stream, each arrived shard's rows
  // multiplied on the compute stream while the next shard travels
  // (models/block_context.h); backward gathers the weight gradient's input on
  // the side stream under the input-gradient GEMM. Needs sequence_parallel
  // and tp > 1.
  bool tp_comm_overlap = false;
  // EP all-to-all overlap, Megatron-Core's --overlap-moe-expert-parallel-comm (combined 1F1B,
  // Megatron-Bridge's moe_a2a_overlap): one warm-up forward more, then each steady-state forward
  // runs interleaved with the backward of an earlier micro-batch, layer by layer, the MoE layers'
  // token all-to-alls on a stream of their own under the other pass's compute
  // (engine/schedule/a2a_overlap.h). Needs a model with experts, ep > 1, the 1F1B schedule without
  // pipelining or the interleaved one, and no full recomputation, as Megatron-Core asserts.
  bool moe_a2a_overlap = false;
  // Megatron-Core's --overlap-p2p-communication (overlap_p2p_comm), which it
  // runs with the interleaved schedule only: each pipeline receive is posted
  // ahead on a stream of its own, so the transfer runs under the compute
  // before it and the compute that reads it waits only for what is still on
  // the wire (engine/parallel/pipeline_executor.h). Without it a stage
  // receives on its compute stream, as Megatron's blocking batched p2p and
  // the 2021 interleaved schedule do.
  bool overlap_p2p_comm = false;
  Offload offload = Offload::none;

  // A plan made of segments (engine/plan/segment_plan.h): each element is
  // the plan of one segment, a contiguous range of the model's blocks with
  // its own layout on its own ranks. Empty: the uniform plan, one segment of
  // the whole model on every rank (what the fields above describe).
  std::vector<Plan> segments;
  // A segment's place, filled by the segment plan (defaults: the whole model
  // on ranks from 0): its label, the global rank of its local rank 0, the
  // first id of its process groups (unique over the segments), and its window
  // of body layers with whether it holds the model's first and last blocks.
  std::string segment_name;
  int first_rank = 0;
  int group_id_base = 0;
  int first_layer = 0, layers = -1;  // -1: to the model's end
  bool embedding = true, head = true;

  // Ranks the plan runs on: tp·pp·dp·cp, or every segment's (the union).
  int world_size() const;
  // Whether global rank `rank` is one of this plan's (a segment's: first_rank onwards).
  bool holds_rank(int rank) const { return rank >= first_rank && rank < first_rank + world_size(); }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  int effective_global_batch() const { return global_batch > 0 ? global_batch : micro_batch * dp; }
  // Micro-batches each pipeline runs per iteration.
  int microbatches() const { return effective_global_batch() / (micro_batch * dp); }
  int effective_seq_len(const ModelSpec& m) const { return seq_len > 0 ? seq_len : m.seq_len; }
  StageSplit stage_split() const {
    return {pp,     vpp,  first_stage_layers, last_stage_layers, first_layer, layers,
            embedding, head, chunk_layers,       embedding_in_split, loss_in_split};
  }
};

// Flags and file fields override the defaults only where given; a flag beats
// the file. Kept as optionals so the merge can tell "given" from "default".
struct PlanOverrides {
  std::optional<int> tp, pp, dp, cp, ep, etp, vpp, zero, micro_batch, global_batch, seq_len;
  std::optional<int> first_stage_layers, last_stage_layers, grad_compression_warmup;
  // Micro-batches per pipeline per iteration: sets global_batch to
  // micro_batch · dp · microbatches (the two must agree when both are given).
  std::optional<int> microbatches;
  std::optional<double> grad_bucket_mb;
  std::optional<std::string> recompute, schedule, precision, grad_sync, grad_dtype, fp8_recipe, cp_comm,
      grad_compression, offload;
  std::optional<bool> sequence_parallel, embedding_in_split, loss_in_split, error_feedback, zero_reduce_once;
  std::optional<bool> prefetch_across_chunks, overlap_update, tp_comm_overlap, megatron_buckets, moe_a2a_overlap;
  std::optional<bool> fp8_param_gather, overlap_p2p_comm;
  std::optional<std::vector<int>> chunk_layers;
  std::optional<std::vector<std::string>> recompute_modules;
  // A plan file's "segments" list as written; the model resolves it
  // (engine/plan/segment_plan.h, segments_from_json).
  std::shared_ptr<const nlohmann::json> segments;
};

// Bounds of a plan, far above any real job: a larger number is a typo, and
// within them no product (world size, global batch, tokens) overflows.
inline constexpr int kMaxWorldSize = 1 << 20;     // ranks (GPUs)
inline constexpr int kMaxGlobalBatch = 1 << 30;  // sequences per iteration
inline constexpr RealRange kGradBucketMbRange{0, 1 << 20, true, false};
inline constexpr IntRange kChunkLayersRange{0, 1 << 16};  // each entry of chunk_layers
inline constexpr int kMaxChunkLayers = 1 << 16;           // entries: pp·vpp virtual stages

// One integer plan field: its JSON key, its command-line flag, where
// PlanOverrides holds it, its range and its help. The plan file reader and
// the flags both take their integer fields and ranges from this one table.
struct PlanIntField {
  const char* key;   // "micro_batch"
  const char* flag;  // "--micro-batch"
  std::optional<int> PlanOverrides::*member;
  int Plan::*field;  // the plan's own field; nullptr where the flag sets others (microbatches)
  IntRange range;
  const char* help;
};
const std::vector<PlanIntField>& plan_int_fields();

Result<PlanOverrides> plan_overrides_from_json(const nlohmann::json& j);
Result<PlanOverrides> plan_overrides_from_file(const std::string& path);
// Applies `o` on top of `base`; names are parsed here (unknown names suggest the nearest).
Result<Plan> apply_overrides(Plan base, const PlanOverrides& o);

// `world_size` 0 means "whatever the plan needs" (tp·pp·dp·cp).
Status validate_plan(const Plan& p, const ModelSpec& m, int world_size = 0);
// The part of it a planner checks on its base plan before the search: an FP8
// recipe other than delayed needs precision fp8.
Status check_fp8_recipe(const Plan& p);
// The part of it the planner asks of a candidate before searching EP
// all-to-all overlap on it: whether moe_a2a_overlap, if set, can pair the
// plan's passes (ep > 1; pp 1 or interleaved; 1f1b or interleaved; no full
// recomputation; ZeRO 0-2).
Status check_a2a_overlap(const Plan& p);

// Schedule names come from the schedule library (schedule_kind_name), the one
// table of them; these keep the plan's name functions in one place.
std::string schedule_name(ScheduleKind s);
std::string recompute_name(Recompute r);
// ["layernorm", "moe_act"] (empty for none), and back from such a list.
std::vector<std::string> recompute_module_names(const RecomputeModules& r);
Result<RecomputeModules> parse_recompute_modules(const std::vector<std::string>& names);
std::string precision_name(Precision p);
std::string grad_sync_name(GradSync g);
std::string grad_dtype_name(GradDtype g);
std::string fp8_recipe_name(Fp8Recipe r);
std::string grad_compression_name(GradCompression c);
std::string offload_name(Offload o);
Result<ScheduleKind> parse_schedule(const std::string& s);
Result<Recompute> parse_recompute(const std::string& s);
Result<Precision> parse_precision(const std::string& s);
Result<GradSync> parse_grad_sync(const std::string& s);
Result<GradDtype> parse_grad_dtype(const std::string& s);
Result<Fp8Recipe> parse_fp8_recipe(const std::string& s);
Result<GradCompression> parse_grad_compression(const std::string& s);
Result<Offload> parse_offload(const std::string& s);

nlohmann::json plan_to_json(const Plan& p);
// Bytes of one parameter, gradient or activation element at this precision.
int element_bytes(Precision p);
// The dtype of the plan's gradient buffers, and the bytes of one element.
DType gradient_dtype(const Plan& p);
int gradient_bytes(const Plan& p);
// The recompute modules the plan runs: none under full recomputation, which
// makes every module of a layer again (as Megatron-Core reads its modules
// only under selective granularity), else the plan's.
RecomputeModules effective_recompute_modules(const Plan& p);
// The recomputation as the one-line summaries print it: its name, and the
// recompute modules it runs after a '+' ("none+layernorm,moe_act").
std::string recompute_label(const Plan& p);
// The precision as the one-line summaries print it: its name, and under
// precision fp8 with current scaling "fp8 (current scaling)".
std::string precision_label(const Plan& p);
// ", bf16 gradients" when the plan keeps them in something other than the
// default fp32, else empty: for the one-line summaries of a plan.
std::string grad_dtype_note(const Plan& p);
// Gradient elements in one of grad_bucket_mb's buckets (ZeRO 0 and 1): the
// MiB count fp32 gradients, whatever grad_dtype keeps them in, so a plan's
// buckets cut the same parameters either way.
double grad_bucket_elements(const Plan& p);

}  // namespace meshtrain
