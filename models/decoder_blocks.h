// The two ends of a decoder-only language model (GPT-2, Llama): the token
// (and learned position) embedding, and the final norm with the output
// projection and the softmax cross-entropy on next tokens. Both are
// vocabulary-parallel under tensor parallelism: each tp rank holds a slice
// of the vocabulary rows, looks up only the tokens it owns (the lookups are
// summed over tp), and computes the cross-entropy on its logits shard with
// the row statistics combined over tp, so the logits are never gathered.
// With tied embeddings the head reads the token embedding; a head chunk
// without the embedding (pp > 1) keeps its own copy, whose gradient the
// engine sums with the first stage's.
//
// Legend: B batch, T sequence, N = B·T, R this rank's rows, C hidden, V
// vocabulary rows on this rank (padded shard).
#pragma once

#include "models/block.h"

namespace meshtrain {

class TokenEmbeddingDef : public BlockDef {
 public:
  explicit TokenEmbeddingDef(const ModelSpec& m) : BlockDef(-1), m_(m) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t seq) const override { return {seq, 0, seq, m_.hidden}; }
  ForwardFlops flops(double, std::int64_t) const override { return {}; }  // a lookup, no GEMM
  double activation_bytes(const ActivationQuery&) const override { return 0; }
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;

 private:
  ModelSpec m_;
};

class LmHeadDef : public BlockDef {
 public:
  explicit LmHeadDef(const ModelSpec& m) : BlockDef(m.layers), m_(m) {}
  std::vector<ParamInfo> parameters() const override;
  std::vector<std::string> borrowed() const override;
  BlockIo io(std::int64_t seq) const override { return {seq, m_.hidden, seq, 0}; }
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  // Both norm tensors and this rank's logits shard (s·b·V/t).
  double activation_bytes(const ActivationQuery& q) const override;
  // The logits' gradient, live next to the logits until they are freed.
  double backward_working_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;

 private:
  ModelSpec m_;
};

}  // namespace meshtrain
