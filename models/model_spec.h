// ModelSpec: the shape of a transformer model, as a value: a decoder-only
// language model (GPT-2, Llama), a vision transformer (ViT), a Swin
// Transformer, or a visual question answering model of three modules
// (models/vqa_spec.h). models/block.h turns it into the model's blocks.
//
// A spec comes from a built-in preset by name or from a JSON file whose field
// names are the ones below (`layers`, `hidden`, ...). Everything that counts
// parameters or FLOPs derives from the blocks' shapes (models/block.h), never
// from a closed formula, so the formulas stay independent checks in the tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/bounded.h"
#include "core/names.h"
#include "core/status.h"

namespace meshtrain {

enum class NormKind { layernorm, rmsnorm };
enum class Activation { gelu, swiglu };
enum class PositionKind { learned, rope };
// decoder: GPT/Llama-style language model on token ids; vit: ViT image
// classifier (Dosovitskiy et al. 2021); swin: Swin Transformer image
// classifier (Liu et al. 2021); vqa: a ViT encoder, a projector and a causal
// decoder that answers a question about the image in one word (LLaVA's
// layout, Liu et al. 2023; models/vqa_spec.h).
enum class ModelFamily { decoder, vit, swin, vqa };
// How a VQA model maps the encoder's tokens to the decoder's width: one
// linear layer (LLaVA) or linear-GELU-linear (LLaVA-1.5's mlp2x_gelu).
enum class ProjectorKind { linear, mlp };

// A VQA model's vision encoder: the transformer dims of a ViT (class token,
// learned positions, bidirectional attention) over the model's image fields
// (image_size, patch, channels). Its norm kind and eps are the model's.
struct VisionEncoderSpec {
  int layers = 0, hidden = 0, heads = 0, ffn = 0;
  Activation activation = Activation::gelu;
  bool bias = true;
  bool operator==(const VisionEncoderSpec&) const = default;
};

struct ModelSpec {
  std::string name = "custom";
  ModelFamily family = ModelFamily::decoder;
  // Body blocks between the first (embedding) and the last (head). For Swin
  // derived: its Swin blocks plus the patch mergings between stages.
  int layers = 0;
  int hidden = 0;    // C
  int heads = 0;     // H, query heads
  int kv_heads = 0;  // G, key/value heads (== heads without grouped-query attention)
  int ffn = 0;       // F, MLP inner width (per expert for MoE)
  int vocab = 0;     // V (decoders)
  // T, the longest sequence (learned position table size). Vision models:
  // derived, the tokens entering the first layer (ViT 1 + (image/patch)², Swin (image/patch)²).
  int seq_len = 0;
  bool tied_embeddings = true;
  bool bias = true;  // biases on linear layers and norms (GPT-2: yes; Llama: no)
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu;
  PositionKind position = PositionKind::learned;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  // Attention head width D; 0: hidden / heads (Qwen3 uses 128 with hidden
  // 2048 and 32 heads, so q is wider than the residual stream).
  int head_dim_size = 0;
  // Sliding-window attention (decoders): a local layer's query at position t
  // reads only keys t - sliding_window + 1 .. t (Mistral, Gemma 2, gpt-oss);
  // 0: every layer reads every earlier key. window_pattern says which layers
  // are local: 0 every layer (Mistral 7B v0.1); P >= 2 all but every P-th,
  // layer l being global when (l + 1) % P == 0 (Gemma 2 and gpt-oss: 2,
  // local and global alternating from a local layer 0; Gemma 3: 6).
  int sliding_window = 0;
  int window_pattern = 0;
  // Attention sinks as gpt-oss trains them: one learned logit per query head
  // and layer that joins the softmax's denominator (a head may attend to
  // nothing). StreamingLLM's sink tokens are an inference-time cache policy,
  // not a trained parameter, so they are not modelled.
  bool attention_sinks = false;
  // Mixture of experts (models/moe_layer.h). A layer l is an MoE layer when
  // experts > 0, l >= dense_layers and l % moe_every == 0 (the rule of
  // DeepSeek's first_k_dense_replace and moe_layer_freq); the others keep a
  // dense MLP of width dense_ffn.
  int experts = 0;  // 0: dense MLP; otherwise experts per MoE layer
  int top_k = 0;    // experts each token is routed to
  int shared_experts = 0;  // experts every token passes through (one MLP of shared_experts·ffn, no gate)
  int moe_every = 1;
  int dense_layers = 0;
  int dense_ffn = 0;       // MLP width of the dense layers of an MoE model; 0: ffn
  // Top-k weights divided by their sum (Mixtral, Qwen3), or the raw softmax
  // probabilities of the chosen experts (Switch, GShard's gates unnormalised).
  bool renormalize = true;
  // Tokens an expert takes from one micro-batch: ceil(capacity_factor · N · top_k / experts)
  // of its N tokens; 0: dropless (every token reaches its experts).
  float capacity_factor = 0.f;
  float aux_loss_coeff = 0.01f;  // Switch/GShard load-balancing loss coefficient
  float z_loss_coeff = 0.f;      // router z-loss coefficient (Zoph et al. 2022); 0: off
  // Vision models: square images of image_size² pixels with `channels`
  // channels, cut into patch² patches, classified into `classes`.
  int image_size = 0, patch = 0, channels = 0, classes = 0;
  // Swin: attention windows of window² tokens; per stage its Swin blocks
  // (depths) and heads (stage_heads); stage i has width hidden·2^i and MLP
  // width ffn·2^i (`hidden`, `heads`, `ffn` are stage 1's).
  int window = 0;
  std::vector<int> depths, stage_heads;
  // VQA (family vqa): the encoder (JSON "vision"), the projector, the
  // decoder's depth, and the question's tokens Q. The transformer fields
  // above (hidden, heads, kv_heads, ffn, vocab, norm, ...) are the
  // decoder's; `layers` and `seq_len` are derived: vision.layers + 2 +
  // decoder_layers body blocks, and (image_size/patch)² + Q decoder tokens.
  VisionEncoderSpec vision_encoder;
  ProjectorKind projector = ProjectorKind::linear;
  int decoder_layers = 0;
  int question_len = 0;

  int head_dim() const { return head_dim_size > 0 ? head_dim_size : hidden / heads; }
  // Body layer l's sliding window (see sliding_window), 0 for a global layer.
  int layer_window(int l) const {
    if (sliding_window == 0) return 0;
    return window_pattern >= 2 && (l + 1) % window_pattern == 0 ? 0 : sliding_window;
  }
  bool moe() const { return experts > 0; }
  // Whether body layer l routes its tokens to experts (see experts above).
  bool moe_layer(int l) const { return experts > 0 && l >= dense_layers && l % moe_every == 0; }
  int moe_layer_count() const {
    int n = 0;
    for (int l = 0; l < layers; ++l) n += moe_layer(l) ? 1 : 0;
    return n;
  }
  int dense_mlp_width() const { return moe() && dense_ffn > 0 ? dense_ffn : ffn; }
  // Reads images (ViT, Swin and VQA); a VQA model reads a question's token ids too.
  bool vision() const { return family != ModelFamily::decoder; }
  bool vqa() const { return family == ModelFamily::vqa; }
  int patch_grid() const { return patch > 0 ? image_size / patch : 0; }  // patches per side
};

std::string family_name(ModelFamily f);
// The names model files give the activations ("gelu", "swiglu").
const EnumNames<Activation>& activation_names();
// One line: "gpt2-124m: 12 layers, hidden 768, ..." or the vision model's
// image, patch, stages and classes.
std::string describe_model(const ModelSpec& m);

// Names of the built-in presets, in a stable order.
const std::vector<std::string>& model_preset_names();
// A preset by name, or an error that suggests the nearest preset name.
Result<ModelSpec> model_preset(const std::string& name);
// A spec from JSON with the preset field names; unknown fields are errors.
Result<ModelSpec> model_from_json(const nlohmann::json& j);
// The range of each integer field of a model file (of a VQA model's "vision"
// object too): far above any real model, far below where a count of
// parameters, FLOPs or bytes would overflow.
IntRange model_field_range(std::string_view key);
// An Error unless image_size, patch and channels are positive and the
// patches tile the image: what every image-reading family checks.
Status validate_image_fields(const ModelSpec& m);
// A preset name, or a path to a JSON file.
Result<ModelSpec> load_model(const std::string& name_or_file);
// Fills the fields a vision model derives (seq_len; a Swin model's layers
// and heads) from the others. Presets and model files call it; call it again
// after changing a vision spec's fields by hand.
void derive_model_fields(ModelSpec& m);
// Checks the spec's own consistency (positive sizes, hidden % heads, heads % kv_heads, ...).
Status validate_model(const ModelSpec& m);

nlohmann::json model_to_json(const ModelSpec& m);

}  // namespace meshtrain
