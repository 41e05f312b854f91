// TransformerLayer: the pre-norm transformer layer every model here is made
// of: x + attn(norm1(x)), then + mlp(norm2(·)), Megatron tensor parallelism
// inside (QKV and MLP-up column-parallel over this rank's heads and ffn
// slice, attention-out and MLP-down row-parallel).
//
// Three attention layouts, one code path:
//  * decoder (GPT, Llama): causal over the sequence, optional RoPE,
//    grouped-query attention, a sliding window (Mistral, Gemma 2, gpt-oss:
//    the layer's FLOPs count only the window's keys) and attention sinks
//    (gpt-oss: a parameter `attn.sinks` of one logit per head, split with
//    the heads under tensor parallelism);
//  * encoder (ViT): bidirectional over the image's tokens;
//  * Swin window attention (Liu et al. 2021): the grid × grid tokens are
//    cut into windows of window × window tokens, cyclically shifted by
//    `shift` first on every second block (then masked so that regions the
//    shift made neighbours do not attend to each other), with a learned
//    relative position bias per head. Windows are index maps: the QKV rows
//    are gathered into window order, attention runs with one batch entry per
//    window, and its output is gathered back before the output projection,
//    so the residual stream keeps the image's row order.
//
// The MLP is dense, or a mixture of experts (models/moe_layer.h) when the
// shape has experts.
//
// Legend: B samples, T tokens per sample, N = B·T, R this rank's rows, C
// width, H/G heads on this rank, D head dim, F ffn on this rank, M window.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/block.h"
#include "models/moe_layer.h"

namespace meshtrain {

struct LayerShape {
  int width = 0;            // C
  int heads = 0, kv_heads = 0, ffn = 0;
  bool causal = true;
  bool rope = false;
  Activation activation = Activation::gelu;
  bool bias = true;         // biases on the linear layers
  int tokens = 0;           // T per sample; 0: the micro-batch's sequence (decoders)
  // Swin windows: the image is grid × grid tokens (T = grid²), windows of
  // window × window tokens, shifted by `shift` (0: not shifted); window 0: none.
  int grid = 0, window = 0, shift = 0;
  float rope_theta = 10000.f;
  int head_dim = 0;  // D; 0: width / heads
  // Causal layers: a query reads only its last sliding_window keys (0: all
  // before it); `sinks`: a learned sink logit per head (AttentionOp::sinks).
  int sliding_window = 0;
  bool sinks = false;
  MoeShape moe;      // experts > 0: the MLP is a mixture of experts (models/moe_layer.h)
  int dim() const { return head_dim > 0 ? head_dim : width / heads; }
};

class TransformerLayerDef : public BlockDef {
 public:
  // `name` prefixes the parameters ("layers.3").
  TransformerLayerDef(int layer, std::string name, LayerShape shape, NormKind norm);

  const LayerShape& shape() const { return shape_; }
  std::vector<ParamInfo> parameters() const override;
  BlockIo io(std::int64_t seq) const override;
  ForwardFlops flops(double samples, std::int64_t seq) const override;
  double activation_bytes(const ActivationQuery& q) const override;
  double backward_working_bytes(const ActivationQuery& q) const override;
  double deferred_weight_bytes(const ActivationQuery& q) const override;
  Status check_tensor_parallel(int tp) const override;
  std::unique_ptr<Block> instantiate(BlockContext& ctx) const override;
  const std::string& name() const { return name_; }
  std::int64_t windows_per_sample() const;

 private:
  std::int64_t tokens(std::int64_t seq) const { return shape_.tokens > 0 ? shape_.tokens : seq; }
  // Tokens one attention call sees per sample: a window, or the whole sequence.
  std::int64_t attention_span(std::int64_t seq) const;

  std::string name_;
  LayerShape shape_;
  NormKind norm_;
};

// The window-order row of every token of B images of grid × grid (window
// partition of the image shifted by -shift, as torch.roll(x, (-s, -s))), and
// its inverse (over `rows` source rows, default the map's size; -1 entries,
// padding, have no inverse); the relative position index of a window's token pairs; the
// shifted-window mask. Exposed for tests.
std::vector<std::int32_t> window_order(int batch, int grid, int window, int shift);
std::vector<std::int32_t> inverse_order(const std::vector<std::int32_t>& order, std::size_t rows = 0);
std::vector<std::int32_t> relative_position_index(int window);
std::vector<float> shifted_window_mask(int grid, int window, int shift);

}  // namespace meshtrain
