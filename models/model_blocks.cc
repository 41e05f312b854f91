// model_blocks: each model family as its list of blocks (models/block.h).
#include <fmt/format.h>

#include "models/block.h"
#include "models/model_io.h"
#include "models/decoder_blocks.h"
#include "models/transformer_layer.h"
#include "models/vision_blocks.h"
#include "models/vqa_blocks.h"

namespace meshtrain {

namespace {

std::string layer_name(int layer) { return "layers." + std::to_string(layer); }

void add_decoder(const ModelSpec& m, ModelBlocks& out) {
  add_block(out, std::make_unique<TokenEmbeddingDef>(m), "embed");
  LayerShape shape;
  shape.width = m.hidden;
  shape.heads = m.heads, shape.kv_heads = m.kv_heads, shape.ffn = m.ffn;
  shape.causal = true;
  shape.rope = m.position == PositionKind::rope;
  shape.rope_theta = m.rope_theta;
  shape.activation = m.activation;
  shape.bias = m.bias;
  shape.head_dim = m.head_dim_size;
  int moe_index = 0;
  for (int l = 0; l < m.layers; ++l) {
    LayerShape layer = shape;
    layer.sliding_window = m.layer_window(l);
    layer.sinks = m.attention_sinks;
    if (m.moe_layer(l)) {
      layer.moe = MoeShape{m.experts,         m.top_k,          m.shared_experts, m.renormalize,
                           m.capacity_factor, m.aux_loss_coeff, m.z_loss_coeff,   moe_index++};
    } else {
      layer.ffn = m.dense_mlp_width();
    }
    add_block(out, std::make_unique<TransformerLayerDef>(l, layer_name(l), layer, m.norm), "layers");
  }
  add_block(out, std::make_unique<LmHeadDef>(m), "head");
}

void add_vit(const ModelSpec& m, ModelBlocks& out) {
  add_vit_encoder(m, "", "embed", "encoder", out);
  add_block(out, std::make_unique<ClassifierHeadDef>(m, m.seq_len, m.hidden, true), "head");
}

void add_swin(const ModelSpec& m, ModelBlocks& out) {
  add_block(out, std::make_unique<PatchEmbeddingDef>(m), "embed");
  int layer = 0, grid = m.patch_grid(), width = m.hidden, ffn = m.ffn;
  for (std::size_t stage = 0; stage < m.depths.size(); ++stage) {
    const std::string module = "stage" + std::to_string(stage + 1);
    if (stage > 0) {
      add_block(out, std::make_unique<PatchMergingDef>(layer, layer_name(layer) + ".merge", grid, width, m.norm), module);
      ++layer;
      grid = (grid + 1) / 2, width *= 2, ffn *= 2;
    }
    LayerShape shape;
    shape.width = width;
    shape.heads = shape.kv_heads = m.stage_heads[stage];
    shape.ffn = ffn;
    shape.causal = false;
    shape.activation = m.activation;
    shape.bias = m.bias;
    shape.grid = grid;
    shape.tokens = grid * grid;
    // A grid no larger than the window is one window, never shifted (Liu et al.'s rule).
    shape.window = std::min(m.window, grid);
    for (int d = 0; d < m.depths[stage]; ++d) {
      shape.shift = (d % 2 == 1 && grid > m.window) ? m.window / 2 : 0;
      add_block(out, std::make_unique<TransformerLayerDef>(layer, layer_name(layer), shape, m.norm), module);
      ++layer;
    }
  }
  add_block(out, std::make_unique<ClassifierHeadDef>(m, grid * grid, width, false), "head");
}

}  // namespace

void add_block(ModelBlocks& out, std::unique_ptr<BlockDef> block, std::string module) {
  block->set_module(std::move(module));
  out.push_back(std::move(block));
}

ModelBlocks model_blocks(const ModelSpec& m) {
  ModelBlocks out;
  switch (m.family) {
    case ModelFamily::decoder: add_decoder(m, out); break;
    case ModelFamily::vit: add_vit(m, out); break;
    case ModelFamily::swin: add_swin(m, out); break;
    case ModelFamily::vqa: add_vqa_blocks(m, out); break;
  }
  return out;
}

std::int64_t loss_terms_per_sample(const ModelSpec& m, std::int64_t seq) { return model_io(m, seq).targets_per_sample; }

}  // namespace meshtrain
