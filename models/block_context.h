// BlockContext: what the blocks of one chunk share on one rank, and the
// primitives they are written with: norms, linear layers under Megatron
// tensor parallelism (and sequence parallelism), dropout, and the index maps
// they upload once.
//
// Linear layers come in three kinds. Column-parallel: this rank's slice of
// the output columns; under sequence parallelism its input rows are
// all-gathered first, and in backward its input gradient is all-reduced
// (reduce-scattered under SP) over tp. Row-parallel: this rank's slice of the
// input; its output is all-reduced (reduce-scattered under SP), and a bias is
// added by tp rank 0 only. Replicated: every tp rank computes the whole layer
// on the same input (small layers such as a patch embedding or Swin's patch
// merging); no communication, and every rank gets the same gradients.
//
// Tensor-parallel communication overlap (options.tp_comm_overlap, under SP):
// a column-parallel layer's all-gather runs as tp-1 ring steps (a send to the
// next tp rank and a receive from the previous one) on tp_stream(); the compute stream multiplies each shard's rows as soon as
// they arrive (rows r·R..(r+1)·R of y = shard_r · W) while the next shard
// travels, as Megatron's tp-comm-overlap pipelines its all-gather. Backward
// gathers the input for the weight gradient on tp_stream() while the input
// gradient's GEMM runs. The cpu backend's GEMM of a row block may differ from
// the whole GEMM's in the last bits (backends/cpu/kernels/gemm.h tiles by
// shape), so the option is exact up to float rounding, not bit for bit.
//
// Legend: N rows, R this rank's rows (N, or N/tp under SP), X a width.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/block.h"
#include "models/fp8_linear.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"

namespace meshtrain {

enum class LinearKind { column, row, replicated };


class BlockContext {
 public:
  BlockContext(Backend& b, const ModelSpec& m, ParameterStore& params, TensorParallel tp, ChunkOptions options);

  Backend& b;
  const ModelSpec& m;
  ParameterStore& params;
  const TensorParallel tp;
  const ChunkOptions options;
  const DType act;  // activations (the working weights' dtype)
  const bool sp;    // sequence parallel (and tp > 1)

  // out = norm(x) with the model's norm kind over the width of `prefix`'s
  // weight; mean is left undefined for RMSNorm. Under SP the weight
  // gradients of a norm over this rank's rows are summed over tp
  // (`sharded_rows`); a norm over rows every tp rank holds in full is not.
  void norm_forward(const std::string& prefix, const Tensor& x, Tensor& out, Tensor& mean, Tensor& rstd);
  void norm_backward(const std::string& prefix, const Tensor& dout, const Tensor& x, const Tensor& mean,
                     const Tensor& rstd, Tensor& dx, bool sharded_rows = true);
  // y (N, out) = x · W [+ b] (b when `name`.bias exists).
  void linear(const std::string& name, const Tensor& x, Tensor& y, LinearKind kind);
  // dx = dy · Wᵀ, dW += xᵀ · dy, db += Σ dy; `dx` null: the input needs no gradient.
  // `input_cast`: under fp8, whether the forward's cast of x is what the backward reads (kept) or x
  // was made again since (a recomputed input: its cast is made again too).
  void linear_backward(const std::string& name, const Tensor& x, const Tensor& dy, Tensor* dx, LinearKind kind,
                       Fp8Cast input_cast = Fp8Cast::kept);
  void tp_all_reduce(Tensor& x);
  // Rows of a (N, ·) tensor on this rank: N, or N/tp under sequence parallelism.
  std::int64_t local_rows(std::int64_t n) const { return sp ? n / tp.size : n; }
  // (R, X) sequence shards -> (R·tp, X) every row, and (R·tp, X) partial sums -> this rank's (R, X).
  // `fp8`: x holds an FP8 cast's values, gathered as FP8 (Backend::all_gather_fp8).
  Tensor sp_gather(const Tensor& x, bool fp8 = false);
  Tensor sp_scatter(const Tensor& x);
  // This rank's rows of a (N, X) tensor every tp rank holds in full, as a tensor of their own.
  Tensor local_part(const Tensor& x);
  // Every row of a (·, width) tensor: this rank's rows gathered under SP, else
  // `x` itself; for blocks that work on whole rows on every tp rank.
  Tensor all_rows(const Tensor& x, std::int64_t width);
  // loss_sum (1) = Σ over the rows of `logits` (N, V) of the softmax
  // cross-entropy against mb.targets (and mb.correct += the rows whose target
  // has the largest logit, when given). `vocab_parallel`: the columns are
  // this rank's vocabulary shard from `vocab_offset`, and the row statistics
  // are combined over tp; otherwise every rank holds all columns. row_max and
  // sumexp (N) are kept for the backward.
  Tensor cross_entropy(const Tensor& logits, const MicroBatch& mb, std::int64_t vocab_offset, bool vocab_parallel,
                       Tensor& row_max, Tensor& sumexp);
  // When tp does not divide the vocabulary, this rank's shard of `rows`
  // columns may end in padding (ids >= vocab): a (rows) bias, 0 on real
  // columns and -1e30 on padded ones, for the head's GEMM, so the padding
  // takes no probability and gets no gradient. Undefined when the shard has
  // no padding.
  Tensor vocab_padding_bias(std::int64_t vocab, std::int64_t rows);
  // Counter-based dropout mask of one site: a sequence shard draws the mask
  // elements of its rows of the whole (N, width) tensor.
  DropoutOp dropout(const MicroBatch& mb, int layer, int site, std::int64_t rows, std::int64_t width) const;
  // A dropout site over rows every tp rank holds in full: the mask of the
  // whole tensor, whatever sequence parallelism does afterwards (site 0).
  DropoutOp whole_dropout(const MicroBatch& mb, int layer, std::int64_t rows, std::int64_t width) const;

  // Precision fp8 (models/fp8_linear.h): when set, the column- and
  // row-parallel linears run their GEMMs on FP8 operands scaled by it.
  Fp8Scaling* fp8 = nullptr;
  // `x`, or its FP8 cast when `kind` of linear `name` runs in FP8 (linear,
  // linear_backward).
  Tensor fp8_operand(const std::string& name, LinearKind kind, Fp8Operand which, const Tensor& x, Fp8Cast cast);
  // `x`, or its FP8 cast under precision fp8, where x is one part of a tensor
  // split as `split` says (Fp8Scaling::quantize): the MoE layer's grouped GEMMs.
  Tensor fp8_operand(const std::string& name, Fp8Operand which, const Tensor& x, Fp8Cast cast, const Fp8Split& split);

  // Zero-bubble schedules (engine/schedule/builders.h, ZB-H1): when set,
  // linear_backward leaves its parameter gradients (dW, db) here as work
  // for the schedule's W pass instead of computing them; the input gradient
  // is computed at once.
  std::vector<std::function<void()>>* deferred_weights = nullptr;

  // What the MoE layers of this chunk report (models/moe_layer.h); its
  // tensors exist when the model has experts.
  MoeStatistics& moe_statistics() { return moe_; }

  // An index map (or any constant i32 tensor) built on the host once per key
  // and kept for the chunk's lifetime (window partitions, merges, positions).
  const Tensor& constant_ids(const std::string& key, const std::function<std::vector<std::int32_t>()>& build);
  // (B·T) i32: the position t of every row b·T + t, for learned position
  // tables; under context parallelism (options.context) the local tokens'
  // places in the whole sequence (context_parallel.h's chunk layout).
  const Tensor& positions(int batch, int tokens);
  // The same for f32 constants (attention masks, pooling weights), in `dtype`.
  const Tensor& constant_values(const std::string& key, const Shape& shape, DType dtype,
                                const std::function<std::vector<float>()>& build);

  // The stream ring context parallelism (context_parallel.h) sends and
  // receives on, so that moving one K/V block overlaps attention on the one
  // before it; created on first use.
  Stream context_stream();
  // The stream tensor-parallel overlap (options.tp_comm_overlap) moves
  // sequence shards on; created on first use.
  Stream tp_stream();

 private:
  // y (N, out) = gather(x) · W [+ op.bias] with the gather pipelined row block by row block.
  // `fp8`: x holds an FP8 cast's values, whose ring steps move FP8 (Backend::all_to_all_fp8).
  void ring_gather_gemm(const Tensor& x, const Tensor& w, Tensor& y, const GemmOp& op, bool fp8);
  // An all-gather over tp of `shard` into `full`, as FP8 where `fp8` (sp_gather's).
  void tp_gather(const Tensor& shard, Tensor& full, bool fp8);
  // Whether a linear of this kind reads FP8 operands (fp8_operand casts them).
  bool fp8_linear(LinearKind kind) const { return fp8 != nullptr && kind != LinearKind::replicated; }

  std::optional<Stream> context_stream_, tp_stream_;
  std::map<std::string, Tensor> constants_;
  MoeStatistics moe_;
};

}  // namespace meshtrain
