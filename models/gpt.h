// GptChunk: a contiguous range of decoder layers on one rank, written against
// backends/backend.h only, so the same code runs on every backend.
//
// Both families come from the ModelSpec: GPT-2 (learned positions, LayerNorm,
// GELU, tied embeddings, biases) and Llama (RoPE, RMSNorm, SwiGLU,
// grouped-query attention, untied head, no biases).
//
// Tensor parallelism is Megatron's, inside the layers: QKV and MLP-up are
// column-parallel (this rank's heads / ffn slice), attention-out and MLP-down
// row-parallel with an all-reduce of the output in forward; the inputs of the
// column-parallel GEMMs get the conjugate all-reduce of their gradient in
// backward. The embedding and the output projection are vocab-parallel and the
// cross-entropy is computed on vocabulary shards (the logits are never
// gathered). Pipeline parallelism sits outside: a chunk takes its input
// activations and returns its output; the engine moves them between stages.
//
// Legend: B batch, T sequence, N = B·T rows, C hidden, H/G query/kv heads on
// this rank, D head dim, F ffn width on this rank, V vocabulary rows on this rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "models/flops.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"

namespace meshtrain {

struct TensorParallel {
  Group group;  // the tensor-parallel group (size 1 without tp)
  int rank = 0;
  int size = 1;
};

// Which part of the model a chunk holds: layers [first, last), plus the
// embeddings if it starts the model and the final norm and head if it ends it.
struct ChunkLayers {
  int first = 0, last = 0;
  bool embedding = false;
  bool head = false;
};

struct MicroBatch {
  Tensor ids;      // (N) i32, read by the chunk with the embedding
  Tensor targets;  // (N) i32, read by the chunk with the head
  int batch = 0, seq = 0;
  std::uint64_t dropout_seed = 0;  // distinct per step and micro-batch
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
  ParameterStorage storage;
  // Sequence parallelism (Korthikanti et al. 2022), with tp > 1: the residual
  // stream, norms and dropout work on this rank's N/tp rows (a contiguous
  // block of the B·T rows; N must divide by tp); the inputs of the
  // column-parallel GEMMs (QKV, MLP-up, the head) are all-gathered and the
  // outputs of the row-parallel ones (attention-out, MLP-down) and the
  // embedding reduce-scattered instead of all-reduced, with the conjugates
  // in backward; norm weight gradients are all-reduced over tp. A chunk's
  // input and output are then (N/tp, C).
  bool sequence_parallel = false;
};

// Called around the work of each layer of a micro-batch: `layer` is -1 for
// the embeddings, 0..L-1 for a transformer layer and L (= m.layers) for the
// final norm and head, visited ascending in forward and descending in
// backward (a full recomputation runs inside the backward's pair). The
// engine uses them to bind parameter and gradient storage just in time
// (ZeRO-2/3) and to reduce a bucket of gradients as soon as it is complete,
// while backward goes on (overlap). Empty functions: no calls.
struct LayerHooks {
  std::function<void(int layer)> before_forward, after_forward;
  std::function<void(int layer)> before_backward, after_backward;
};

// What one forward saved for its backward. Dropping it frees the memory.
struct ChunkActivations;
struct ChunkActivationsDeleter {
  void operator()(ChunkActivations* a) const;
};
using SavedActivations = std::unique_ptr<ChunkActivations, ChunkActivationsDeleter>;

class GptChunk {
 public:
  GptChunk(Backend& b, const ModelSpec& m, ChunkLayers layers, TensorParallel tp, ChunkOptions options);

  ParameterStore& parameters() { return params_; }
  const ChunkLayers& layers() const { return layers_; }

  // Forward of one micro-batch. `input` (B, T, C) is the previous chunk's
  // output; undefined for the chunk with the embedding. Returns this chunk's
  // output (B, T, C), or for the chunk with the head loss_sum (1) = Σ of the N
  // token losses. `saved` receives what backward needs.
  Tensor forward(const MicroBatch& mb, const Tensor& input, SavedActivations& saved);
  // Backward of the same micro-batch: `dout` (B, T, C) from the next chunk, or
  // for the head chunk undefined with d(objective)/d(loss_sum) = loss_scale.
  // Accumulates parameter gradients and consumes `saved`; returns d input
  // (undefined for the chunk with the embedding).
  Tensor backward(const MicroBatch& mb, SavedActivations& saved, const Tensor& dout, float loss_scale);

  void set_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }

 private:
  friend struct ChunkActivations;
  struct LayerSaved;
  struct HeadSaved;
  Tensor layer_forward(int layer, const MicroBatch& mb, const Tensor& x, LayerSaved* saved);
  Tensor layer_backward(int layer, const MicroBatch& mb, LayerSaved& s, const Tensor& dout);
  Tensor embed_forward(const MicroBatch& mb);
  void embed_backward(const MicroBatch& mb, const Tensor& dx);
  Tensor head_forward(const MicroBatch& mb, const Tensor& x, HeadSaved& s);
  Tensor head_backward(const MicroBatch& mb, HeadSaved& s, float loss_scale);

  // out = norm(x) with the chunk's norm kind; mean is left undefined for RMSNorm.
  void norm_forward(const std::string& prefix, const Tensor& x, Tensor& out, Tensor& mean, Tensor& rstd);
  void norm_backward(const std::string& prefix, const Tensor& dout, const Tensor& x, const Tensor& mean,
                     const Tensor& rstd, Tensor& dx);
  // y (N, out) = x · W [+ b]; the row-parallel ones all-reduce y over tp.
  void linear(const std::string& name, const Tensor& x, Tensor& y, bool row_parallel);
  // dx = dy · Wᵀ (all-reduced over tp for column-parallel), dW += xᵀ · dy, db += Σ dy.
  void linear_backward(const std::string& name, const Tensor& x, const Tensor& dy, Tensor& dx, bool row_parallel);
  void tp_all_reduce(Tensor& x);
  DropoutOp dropout(const MicroBatch& mb, int layer, int site) const;
  // Rows of the residual stream on this rank: N, or N/tp under sequence parallelism.
  std::int64_t local_rows(const MicroBatch& mb) const;
  // (R, X) sequence shards -> (R·tp, X) all rows, and (R·tp, X) partial sums -> this rank's (R, X).
  Tensor gather_rows(const Tensor& x);
  Tensor scatter_rows(const Tensor& x);
  const Tensor& positions(const MicroBatch& mb);

  Backend& b_;
  const ModelSpec m_;
  ChunkLayers layers_;
  TensorParallel tp_;
  ChunkOptions options_;
  ParameterStore params_;
  int heads_, kv_heads_, ffn_;  // on this rank
  std::int64_t vocab_rows_;     // V on this rank (padded shard)
  DType act_;                   // activations (the working weights' dtype)
  bool sp_;                     // sequence parallel (and tp > 1)
  LayerHooks hooks_;
  Tensor position_ids_;         // (N) i32, built once per (B, T)
  int position_batch_ = 0, position_seq_ = 0;
};

}  // namespace meshtrain
