// The blocks a vision transformer adds to the transformer layer:
//  * PatchEmbedding: the image cut into patch × patch squares, each
//    flattened (row, column, channel) and projected to C by one GEMM (what a
//    strided convolution computes); ViT (Dosovitskiy et al. 2021) then
//    prepends a learned class token and adds learned position embeddings;
//    Swin (Liu et al. 2021) normalises the patch embeddings instead.
//  * PatchMerging (Swin, between stages): each 2×2 neighbourhood of tokens
//    concatenated (4C; an odd grid is padded with zero tokens), normalised,
//    and projected to 2C without bias.
//  * ClassifierHead: the final norm, the class token's row (ViT) or the mean
//    over tokens (Swin), a linear layer to the classes, and the softmax
//    cross-entropy on the labels.
// All three are small and replicated over tensor parallelism: every tp rank
// computes them whole on the full rows (gathered under sequence
// parallelism, then this rank's rows kept), so they need no communication
// beyond that gather and every rank holds the same gradients.
//
// Legend: B images, I image side, P patch side, K channels, S = I/P patch
// grid side, T tokens per image, N = B·T, C width, Y classes.
#pragma once

#include "models/block.h"

namespace meshtrain {

class PatchEmbeddingDef : public BlockDef {
 public:
  // `m` is the image model (a VQA model's encoder as a ViT spec); `prefix`
  // goes before the parameter names ("vision." in a VQA model).
  explicit PatchEmbeddingDef(const ModelSpec& m, std::string prefix = "")
      : BlockDef(-1), m_(m), prefix_(std::move(prefix)) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t seq) const override;
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  bool class_token() const { return m_.family == ModelFamily::vit; }
  const ModelSpec& spec() const { return m_; }
  std::string param(const char* name) const { return prefix_ + name; }

 private:
  ModelSpec m_;
  std::string prefix_;
};

class PatchMergingDef : public BlockDef {
 public:
  // Merges a grid × grid map of `width` channels; `name` prefixes the parameters.
  PatchMergingDef(int layer, std::string name, int grid, int width, NormKind norm)
      : BlockDef(layer), name_(std::move(name)), grid_(grid), width_(width), norm_(norm) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t seq) const override;
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  const std::string& name() const { return name_; }
  int grid() const { return grid_; }
  int out_grid() const { return (grid_ + 1) / 2; }
  int width() const { return width_; }

 private:
  std::string name_;
  int grid_, width_;
  NormKind norm_;
};

class ClassifierHeadDef : public BlockDef {
 public:
  // Reads `tokens` tokens of `width`; pools the class token (ViT) or the mean.
  ClassifierHeadDef(const ModelSpec& m, int tokens, int width, bool class_token)
      : BlockDef(m.layers), m_(m), tokens_(tokens), width_(width), class_token_(class_token) {}
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t) const override { return {tokens_, width_, 1, 0}; }
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  int tokens() const { return tokens_; }
  int width() const { return width_; }
  bool class_token() const { return class_token_; }

 private:
  ModelSpec m_;
  int tokens_, width_;
  bool class_token_;
};

// A ViT's patch embedding and encoder layers (hook indices -1, 0 ..
// vit.layers - 1), appended to `out` with parameter names after `prefix`
// ("vision." in a VQA model) and in modules `embed_module` and
// `layers_module` (BlockDef::module): a ViT classifier's "embed" and
// "encoder", a VQA model's "vision" for both.
void add_vit_encoder(const ModelSpec& vit, const std::string& prefix, const std::string& embed_module,
                     const std::string& layers_module, ModelBlocks& out);

// Index maps, exposed for tests. The gather that cuts B images of I × I × K
// into (B·S², P·P·K) patch rows, from the (B·I·I, K) pixel rows; the gather
// that builds 2×2-merged rows (B·S'², 4C) from (B·S², C) rows (S' = ⌈S/2⌉,
// -1 where the odd grid is padded).
std::vector<std::int32_t> patch_order(int batch, int image, int patch);
std::vector<std::int32_t> merge_order(int batch, int grid);

}  // namespace meshtrain
