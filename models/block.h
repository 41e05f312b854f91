// Blocks: a model is a sequence of them (token or patch embedding, decoder or
// encoder layer, Swin block, patch merging, head), each written against
// backends/backend.h alone.
//
// A block is described twice:
//  * BlockDef, a value of the model: its parameters (full shapes and how
//    tensor parallelism splits them), the tokens and width it reads and
//    writes, its FLOPs, what it saves for backward and the checks a plan must
//    pass. Parameter counts, FLOPs and the memory model all come from here.
//  * Block, one rank's instance inside a ModelChunk (models/model_chunk.h):
//    forward and backward of one micro-batch on that rank's shards.
// The engine (schedules, data parallelism, ZeRO, recomputation, tracing,
// checkpoints) and the sim backend see only chunks, parameters and ops;
// adding a model kind adds blocks, not branches there.
//
// Hook indices (LayerHooks, ParamInfo::layer): the model's first block is -1
// (an embedding), its body blocks 0..L-1 (L = ModelSpec::layers, which for
// Swin counts its patch mergings too), its last block L (the head).
//
// Legend: B batch (images or sequences), T tokens per sample at a block,
// N = B·T rows, C width, H/G query/kv heads on this rank, D head dim.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/phased.h"
#include "core/status.h"
#include "models/context_parallel.h"
#include "models/flops.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"
#include "models/parameters.h"

namespace meshtrain {

struct TensorParallel {
  Group group;  // the tensor-parallel group (size 1 without tp)
  int rank = 0;
  int size = 1;
};

class MoeRouting;

// Expert parallelism (models/moe_layer.h): this rank's place in the expert
// mesh. Expert weights are split over `group` (EP: each rank holds
// experts/size of them) and, within an expert, over `tensor` (expert tensor
// parallelism, etp: the tp group, or this rank alone).
struct ExpertParallel {
  Group group;  // size 1 without expert parallelism
  int rank = 0, size = 1;
  Group tensor;
  int tensor_rank = 0, tensor_size = 1;
};

// What the mixture-of-experts layers report about the micro-batches whose
// forward kept activations (training, and evaluation forwards; the engine
// clears it at every step).
struct MoeStatistics {
  // (2) f32: Σ over micro-batches and MoE layers of the load-balancing loss
  // E·Σ_e f_e·P_e (1 when balanced) and of the mean squared router
  // log-sum-exp, before their coefficients.
  Tensor losses;
  std::map<int, std::vector<double>> tokens;  // by MoE layer (model-wide index): assignments per expert, before drops
  double assignments = 0, dropped = 0;
  void clear(Backend& b);
};

struct ChunkOptions {
  Recompute recompute = Recompute::none;
  float dropout = 0.f;  // after attention, after the MLP and on the embeddings
  // What the parameter store keeps (models/parameter_store.h). Its
  // value_dtype is also the activations' dtype: with a 16-bit one (mixed
  // precision) the chunk issues its activations, activation gradients, GEMMs
  // and tensor-parallel all-reduces in 16 bits on the 16-bit working weights,
  // as Megatron does, while parameter gradients (GEMM outputs in fp32),
  // norm statistics, attention lse, the loss and the cross-entropy row
  // statistics stay fp32. The cpu backend computes in fp32 only.
  ParameterStorage storage{};
  // Sequence parallelism (Korthikanti et al. 2022), with tp > 1: the residual
  // stream, norms and dropout work on this rank's N/tp rows (a contiguous
  // block of the B·T rows; N must divide by tp); the inputs of the
  // column-parallel GEMMs (QKV, MLP-up, the head) are all-gathered and the
  // outputs of the row-parallel ones (attention-out, MLP-down) and the
  // embedding reduce-scattered instead of all-reduced, with the conjugates
  // in backward; norm weight gradients are all-reduced over tp. A chunk's
  // input and output are then (N/tp, C).
  bool sequence_parallel = false;
  // With sequence parallelism: the all-gather before a column-parallel GEMM
  // runs as a ring of send/recv on a side stream, pipelined with the GEMM's
  // row blocks (BlockContext::linear; engine/plan/plan.h tp_comm_overlap).
  bool tp_comm_overlap = false;
  ExpertParallel expert{};
  // Context parallelism (models/context_parallel.h): the micro-batch holds
  // this rank's T/cp tokens of each sequence; attention exchanges keys and
  // values over the group.
  ContextParallel context{};
  // How tokens spread over experts where the backend holds no data to route
  // them (the sim backend); null: the router decides on the data.
  std::shared_ptr<const MoeRouting> routing{};
  RecomputeModules recompute_modules{};
  // EP all-to-all overlap (engine/plan/plan.h moe_a2a_overlap): the MoE layers' token all-to-alls run
  // on this stream, one per rank shared by its chunks as Megatron-Core's one communication stream,
  // and the compute stream waits for each only where its rows are read.
  std::optional<Stream> expert_stream{};
};

// One micro-batch as the blocks read it.
struct MicroBatch {
  Tensor ids;      // (B·T) i32 token ids, read by a token embedding
  Tensor pixels;   // (B, H, W, channels) in the activation dtype, read by a patch embedding
  Tensor targets;  // (B·T) i32 next tokens, or (B) i32 class labels, read by the head
  int batch = 0;   // B
  int seq = 0;     // T at the model's input: the sequence, or the image's tokens
  std::uint64_t dropout_seed = 0;  // distinct per step and micro-batch
  // When defined, (1) f32: the head adds the number of rows whose target has
  // the largest logit (top-1 accuracy; cross_entropy_accuracy).
  Tensor correct;
};

// Called around the work of each block of a micro-batch with its hook index,
// ascending in forward and descending in backward (a full recomputation runs
// inside the backward's pair). The engine uses them to bind parameter and
// gradient storage just in time (ZeRO-2/3) and to reduce a bucket of
// gradients as soon as it is complete, while backward goes on (overlap).
// Empty functions: no calls.
struct LayerHooks {
  std::function<void(int layer)> before_forward, after_forward;
  std::function<void(int layer)> before_backward, after_backward;
};

// What memory a block's forward keeps for backward, asked by the memory
// model: the micro-batch and the plan's facts that change it.
struct ActivationLayout {
  int value_bytes = 2;
  int mask_bytes = 1;                  // 0: masks regenerated, not stored
  bool materialized_attention = true;  // the s×s probabilities are saved
  bool row_stats = false;              // fp32 norm statistics and attention lse are saved
  // Bytes of a parameter gradient; 0: the plan's precision (the ZeRO paper's
  // 16-bit gradients). meshtrain accumulates gradients in fp32 as Megatron
  // does (main_grad), so mixed precision costs 2 + 4 + 12 bytes a parameter,
  // unless the plan keeps them in bf16 (engine/plan/plan.h GradDtype).
  int gradient_bytes = 0;
  // Bytes of a saved input of a linear layer's GEMM (the norms' outputs, the
  // attention output, the MLP's second input); 0: value_bytes. FP8 training
  // keeps the FP8 cast it multiplied (1 byte), as Transformer Engine does.
  int gemm_input_bytes = 0;
};
struct ActivationQuery {
  double micro_batch = 1;  // B
  double seq = 0;          // T at the model's input (this rank's share under context parallelism)
  int tp = 1;
  int cp = 1;         // context parallelism: seq is this rank's share, attention keeps the whole sequence's K and V
  bool cp_ring = false;  // context parallelism exchanges K and V block by block (ring), not all at once
  int expert_tp = 0;  // expert tensor parallelism; 0: as tp
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  RecomputeModules recompute_modules{};
  ActivationLayout layout;
};

// One rank's instance of a block.
class Block {
 public:
  struct Saved {
    virtual ~Saved() = default;
  };
  virtual ~Block() = default;
  // Forward of one micro-batch: `x` is the previous block's output (undefined
  // for the first block). Returns this block's output, or for the head
  // loss_sum (1) = Σ of the micro-batch's losses. With `saved` null nothing is
  // kept (a recomputed block's first forward).
  virtual Tensor forward(const MicroBatch& mb, const Tensor& x, std::unique_ptr<Saved>* saved) = 0;
  // Backward of the same micro-batch: `dout` is the next block's input
  // gradient, undefined for the head, whose objective's derivative with
  // respect to loss_sum is `loss_scale`. Accumulates parameter gradients and
  // returns the input gradient (undefined for the first block).
  virtual Tensor backward(const MicroBatch& mb, Saved& saved, const Tensor& dout, float loss_scale) = 0;
  // The same passes as phases (core/phased.h) for a schedule that interleaves
  // two micro-batches' passes (EP all-to-all overlap): a block with
  // all-to-alls pauses after issuing each (models/moe_layer.h); any other
  // block is one phase.
  virtual Phased<Tensor> forward_phased(const MicroBatch& mb, Tensor x, std::unique_ptr<Saved>* saved) {
    co_return forward(mb, x, saved);
  }
  virtual Phased<Tensor> backward_phased(const MicroBatch& mb, Saved& saved, Tensor dout, float loss_scale) {
    co_return backward(mb, saved, dout, loss_scale);
  }
};

class BlockContext;

// Per sample, what a block reads and writes.
struct BlockIo {
  std::int64_t tokens_in = 0, width_in = 0;
  std::int64_t tokens_out = 0, width_out = 0;
};

class BlockDef {
 public:
  explicit BlockDef(int layer) : layer_(layer) {}
  virtual ~BlockDef() = default;

  int layer() const { return layer_; }  // hook index
  // The part of the model the block belongs to, by which a plan's segment
  // may name it: "embed", "layers" and "head" for a decoder; "embed",
  // "encoder", "head" for ViT; "embed", "stage1".."stageN" (a stage's
  // patch merging with it), "head" for Swin; "vision", "projector" and
  // "language" for VQA (models/vqa_blocks.h).
  const std::string& module() const { return module_; }
  void set_module(std::string module) { module_ = std::move(module); }
  // Every parameter of the block, in model order, with `layer()` as ParamInfo::layer.
  virtual std::vector<ParamInfo> parameters() const = 0;
  // Parameters the block reads but another block owns (the tied head reads
  // the token embedding); a chunk without their owner keeps its own copy.
  virtual std::vector<std::string> borrowed() const { return {}; }
  // `seq` is T at the model's input (a decoder's sequence; fixed for images).
  virtual BlockIo io(std::int64_t seq) const = 0;
  // Forward FLOPs for `samples` samples: GEMMs (2 per multiply-add) and the
  // attention core (q·kᵀ and p·v over the full score matrix).
  virtual ForwardFlops flops(double samples, std::int64_t seq) const = 0;
  // Bytes the block saves for backward for one micro-batch (full
  // recomputation keeps only a body block's input, which the chunk saves).
  virtual double activation_bytes(const ActivationQuery& q) const = 0;
  // Bytes of activation gradients its backward holds at once at its peak.
  virtual double backward_working_bytes(const ActivationQuery& q) const { return 0; }
  // Bytes a micro-batch keeps from its backward (B) to its weight-gradient
  // pass (W) under a zero-bubble schedule (BlockContext::deferred_weights):
  // the inputs and output gradients of the GEMMs whose dW waits (B frees
  // the rest of its activations).
  virtual double deferred_weight_bytes(const ActivationQuery& q) const { return 0; }
  // Whether the plan's tensor parallelism can split it: an Error names the numbers.
  virtual Status check_tensor_parallel(int tp) const { return ok_status(); }
  virtual std::unique_ptr<Block> instantiate(BlockContext& ctx) const = 0;

 private:
  int layer_;
  std::string module_;
};

using ModelBlocks = std::vector<std::unique_ptr<const BlockDef>>;

// The blocks of a model in order: blocks[0] has hook index -1, blocks[L + 1] L.
ModelBlocks model_blocks(const ModelSpec& m);
// Appends `block` to `out` as a block of `module` (BlockDef::module).
void add_block(ModelBlocks& out, std::unique_ptr<BlockDef> block, std::string module);

// Samples' losses each micro-batch sums: T per sequence for a decoder, one per
// image (or, VQA, per answer).
std::int64_t loss_terms_per_sample(const ModelSpec& m, std::int64_t seq);

}  // namespace meshtrain
