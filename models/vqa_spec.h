// The VQA family's spec: a model of three modules that answers a question
// about an image in one word (LLaVA's layout, Liu et al. 2023):
//
//   image ─► vision: ViT patch embedding (class token, learned positions)
//                    and `vision.layers` bidirectional encoder layers
//         ─► projector: the patch tokens (the class token dropped, as
//                    LLaVA's select_feature = "patch") to the decoder's width
//   question ids ─► language: the image tokens prepended to the question's
//                    token embeddings (+ learned positions), causal decoder
//                    layers, the final norm, the question's last row projected
//                    to the vocabulary, cross-entropy on the answer word.
//
// Fields. The image fields are ViT's (image_size, patch, channels); the
// encoder's transformer dims are nested under "vision" ({layers, hidden,
// heads, ffn, activation, bias}), because the top-level transformer fields
// (hidden, heads, kv_heads, ffn, vocab, norm, activation, bias, position,
// rope_theta) are the decoder's: every shared primitive (BlockContext's
// norms, the vocabulary-parallel embedding and head, padded_vocab) reads
// them there. `projector` is "linear" or "mlp"; `decoder_layers` the
// decoder's depth; `question_len` Q the question's tokens (left-padded, so
// that the last row predicts the answer). Derived: `layers` (vision.layers +
// 2 + decoder_layers: the projector and the question joiner are body blocks
// of their own) and `seq_len` ((image_size/patch)² + Q, the decoder's tokens).
// One norm kind and eps serve the whole model; the decoder's embedding and
// head are never tied (the question embedding sits mid-model, so no
// pipeline end holds both).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "models/model_spec.h"

namespace meshtrain {

// P: the image tokens the decoder reads (the encoder's patches).
int vqa_image_tokens(const ModelSpec& m);
// The encoder as a ViT spec (family vit, no classes), for its patch
// embedding and for descriptions.
ModelSpec vision_encoder_model(const ModelSpec& m);

// vqa-tiny (tests), vqa-fmnist (trainable here), llava-1.5-13b (what-ifs).
std::vector<ModelSpec> vqa_presets();

// Reads the VQA fields of a model file (called for "family": "vqa" before
// the common fields); refuses fields the family derives or does not read.
Status read_vqa_fields(const nlohmann::json& j, ModelSpec& m);
void derive_vqa_fields(ModelSpec& m);
Status validate_vqa(const ModelSpec& m);
std::string describe_vqa(const ModelSpec& m);
nlohmann::json vqa_to_json(const ModelSpec& m);

}  // namespace meshtrain
