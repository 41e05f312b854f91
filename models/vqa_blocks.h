// The blocks a VQA model (models/vqa_spec.h) adds to the ViT patch
// embedding and the transformer layers:
//  * ProjectorDef (module `projector`): drops each image's class token and
//    maps its patch tokens from the encoder's width to the decoder's, by one
//    linear layer or linear-GELU-linear. Replicated over tensor parallelism,
//    like the patch embedding: it is Cv·Cd weights (5M of LLaVA-1.5-13B's
//    13B) and 2·P·Cv·Cd FLOPs per image (0.04% of the decoder's), so
//    splitting it would buy nothing and cost a collective; replicated, every
//    tp rank computes it whole on the full rows with no communication beyond
//    the sequence-parallel gather, and holds the same gradients.
//  * QuestionJoinerDef (module `language`): the decoder's input, each
//    sample's P image tokens followed by its Q question tokens' embeddings
//    (vocabulary-parallel like the decoder's token embedding: each tp rank
//    looks up the ids of its vocabulary shard, summed over tp), plus learned
//    positions over the P + Q tokens (with rope the layers rotate instead).
//  * AnswerHeadDef (module `language`): the final norm, projection to the
//    vocabulary and softmax cross-entropy of the LM head, on one row per
//    sample: the question's last token, which predicts the answer word
//    (questions are left-padded, so it is row P + Q - 1). Vocabulary-
//    parallel: each tp rank holds a slice of the vocabulary's columns and
//    the row statistics are combined over tp (BlockContext::cross_entropy).
// Under sequence parallelism each gathers the rows it needs and returns this
// rank's rows, as the vision blocks do.
//
// Legend: B samples, P image tokens (patches), Tv = 1 + P encoder tokens, Q
// question tokens, T = P + Q decoder tokens, Cv encoder width, Cd decoder
// width, V vocabulary columns on this rank.
#pragma once

#include <vector>

#include "models/block.h"

namespace meshtrain {

class ProjectorDef : public BlockDef {
 public:
  ProjectorDef(int layer, const ModelSpec& m);
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t) const override;
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  int image_tokens() const { return patches_; }  // P
  int in_width() const { return in_; }           // Cv
  int out_width() const { return out_; }         // Cd
  bool mlp() const { return mlp_; }

 private:
  int patches_, in_, out_;
  bool mlp_;
};

class QuestionJoinerDef : public BlockDef {
 public:
  QuestionJoinerDef(int layer, const ModelSpec& m) : BlockDef(layer), m_(m) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t) const override;
  ForwardFlops flops(double, std::int64_t) const override { return {}; }  // lookups, no GEMM
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  const ModelSpec& spec() const { return m_; }

 private:
  ModelSpec m_;
};

class AnswerHeadDef : public BlockDef {
 public:
  explicit AnswerHeadDef(const ModelSpec& m) : BlockDef(m.layers), m_(m) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t) const override { return {m_.seq_len, m_.hidden, 1, 0}; }
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  const ModelSpec& spec() const { return m_; }

 private:
  ModelSpec m_;
};

// A VQA model's blocks in order, in modules (BlockDef::module) "vision"
// (patch embedding and encoder layers), "projector" and "language" (question
// joiner, decoder layers, answer head), so a plan's segment can place each.
void add_vqa_blocks(const ModelSpec& m, ModelBlocks& out);

// Index maps, exposed for tests: (B·T) the decoder's row b·T + t reads
// source row b·P + t (an image token) for t < P, else B·P + b·Q + t - P (a
// question token) of [B·P image rows | B·Q question rows]; (B) the row that
// predicts each sample's answer, b·T + T - 1.
std::vector<std::int32_t> joined_order(int batch, int image_tokens, int question_tokens);
std::vector<std::int32_t> answer_rows(int batch, int tokens);

}  // namespace meshtrain
