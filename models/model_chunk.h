// ModelChunk: a contiguous range of a model's blocks on one rank (a pipeline
// stage's share, or one chunk of it when interleaved), written against
// backends/backend.h only, so the same code runs on every backend.
//
// It owns the chunk's ParameterStore (the blocks' parameters in model order,
// plus a copy of what a block borrows from a block outside the chunk: the
// tied head's token embedding) and one instance of each block, and runs
// them in order, calling the LayerHooks around each. Full recomputation
// keeps only a body block's input in forward and runs its forward again
// inside backward. Pipeline parallelism sits outside: a chunk takes its
// input activations and returns its output; the engine moves them.
//
// Legend: B samples, R rows this rank holds at a boundary (B·T, or B·T/tp
// under sequence parallelism), X width at that boundary.
#pragma once

#include <memory>
#include <vector>

#include "backends/backend.h"
#include "models/block.h"
#include "models/block_context.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"

namespace meshtrain {

// Which part of the model a chunk holds: body blocks [first, last), plus the
// first block (the embedding) if it starts the model and the last (the head)
// if it ends it (hook indices, models/block.h).
struct ChunkLayers {
  int first = 0, last = 0;
  bool embedding = false;
  bool head = false;
};

// What one forward saved for its backward. Dropping it frees the memory.
struct ChunkActivations;
struct ChunkActivationsDeleter {
  void operator()(ChunkActivations* a) const;
};
using SavedActivations = std::unique_ptr<ChunkActivations, ChunkActivationsDeleter>;

class ModelChunk {
 public:
  ModelChunk(Backend& b, const ModelSpec& m, ChunkLayers layers, TensorParallel tp, ChunkOptions options);
  ~ModelChunk();

  ParameterStore& parameters() { return params_; }
  const ChunkLayers& layers() const { return layers_; }

  // Forward of one micro-batch. `input` (R, X) is the previous chunk's
  // output; undefined for the chunk with the embedding. Returns this chunk's
  // output (R, X), or for the chunk with the head loss_sum (1) = Σ of the
  // micro-batch's losses. `saved` receives what backward needs.
  Tensor forward(const MicroBatch& mb, const Tensor& input, SavedActivations& saved);
  // Backward of the same micro-batch: `dout` (R, X) from the next chunk, or
  // for the head chunk undefined with d(objective)/d(loss_sum) = loss_scale.
  // Accumulates parameter gradients and consumes `saved`; returns d input
  // (undefined for the chunk with the embedding).
  Tensor backward(const MicroBatch& mb, SavedActivations& saved, const Tensor& dout, float loss_scale);
  // The same passes as phases (core/phased.h), pausing where the blocks pause: what the EP
  // all-to-all overlap interleaves, one micro-batch's forward with another's backward.
  Phased<Tensor> forward_phased(const MicroBatch& mb, Tensor input, SavedActivations& saved);
  Phased<Tensor> backward_phased(const MicroBatch& mb, SavedActivations& saved, Tensor dout, float loss_scale);

  // The shape of the chunk's input (or, `output`, of its output) for a
  // micro-batch of `batch` samples of `seq` tokens at the model's input.
  Shape boundary_shape(int batch, int seq, bool output) const;

  void set_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }
  // Where backward leaves its linear layers' parameter gradients (null: computed in backward);
  // BlockContext::deferred_weights.
  void defer_weight_gradients(std::vector<std::function<void()>>* sink) { ctx_.deferred_weights = sink; }
  // Precision fp8: the scaling state the chunk's FP8 linears use (null: fp32 GEMMs); must outlive the chunk's use.
  void use_fp8(Fp8Scaling* scaling) { ctx_.fp8 = scaling; }
  // What the chunk's mixture-of-experts layers reported since the last clear.
  MoeStatistics& moe_statistics() { return ctx_.moe_statistics(); }

 private:
  Backend& b_;
  const ModelSpec m_;
  ModelBlocks defs_;  // the whole model's; this chunk runs [begin_, end_)
  std::size_t begin_ = 0, end_ = 0;
  ChunkLayers layers_;
  ParameterStore params_;
  BlockContext ctx_;
  std::vector<std::unique_ptr<Block>> blocks_;  // by position in [begin_, end_)
  LayerHooks hooks_;
};

}  // namespace meshtrain
