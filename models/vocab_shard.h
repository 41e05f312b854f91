// The head a language model's loss goes through (decoder_blocks.cc's LmHead,
// vqa_blocks.cc's AnswerHead): a column-parallel projection onto this tp
// rank's shard of the padded vocabulary (padded_vocab, with
// BlockContext::vocab_padding_bias masking the padding), and the
// vocabulary-parallel cross-entropy over its logits.
#pragma once

#include <cstdint>

#include "models/block_context.h"
#include "models/parameters.h"

namespace meshtrain {

class VocabShard {
 public:
  VocabShard(const ModelSpec& m, BlockContext& ctx)
      : ctx_(ctx),
        rows_(padded_vocab(m, ctx.tp.size) / ctx.tp.size),
        padding_(ctx.vocab_padding_bias(m.vocab, rows_)) {}

  std::int64_t rows() const { return rows_; }                   // V on this rank
  std::int64_t offset() const { return ctx_.tp.rank * rows_; }  // its first vocabulary id

  // logits = x · w, or x · wᵀ where `transposed` (a head tied to the (V, C)
  // embedding), over x's `n` rows; returns the loss summed over them, with
  // what backward reads in row_max and sumexp.
  Tensor forward(const MicroBatch& mb, const Tensor& x, std::int64_t n, const Tensor& w, bool transposed,
                 Tensor& logits, Tensor& row_max, Tensor& sumexp) {
    logits = ctx_.b.empty(Shape{n, rows_}, ctx_.act);
    ctx_.b.gemm(x, w, logits, GemmOp{false, transposed, 1.f, 0.f, padding_});
    return ctx_.cross_entropy(logits, mb, offset(), true, row_max, sumexp);
  }

  // The gradient of the loss (times loss_scale) with respect to the logits.
  Tensor logits_grad(const MicroBatch& mb, const Tensor& logits, const Tensor& row_max, const Tensor& sumexp,
                     float loss_scale) {
    Tensor dlogits = ctx_.b.empty(logits.shape(), ctx_.act);
    ctx_.b.cross_entropy_backward(logits, mb.targets, row_max, sumexp, offset(), loss_scale, dlogits);
    return dlogits;
  }

  // Backward through an untied (C, V) weight `w` applied to x: dx = dlogits
  // · wᵀ, and dlogits' product with x added to w's gradient.
  void untied_backward(const ParamSlot& w, const Tensor& x, const Tensor& dlogits, Tensor& dx) {
    ctx_.b.gemm(dlogits, w.value, dx, GemmOp{false, true});
    Tensor dw = w.grad;
    ctx_.b.gemm(x, dlogits, dw, GemmOp{true, false, 1.f, 1.f});
  }

 private:
  BlockContext& ctx_;
  std::int64_t rows_;
  Tensor padding_;  // (rows_): undefined without padding
};

}  // namespace meshtrain
