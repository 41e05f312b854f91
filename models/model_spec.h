// ModelSpec: the shape of a decoder-only transformer, as a value.
//
// A spec comes from a built-in preset by name or from a JSON file whose field
// names are the ones below (`layers`, `hidden`, ...). Everything that counts
// parameters or FLOPs derives from the layer shapes in models/parameters.h, never
// from a closed formula, so the formulas stay independent checks in the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace meshtrain {

enum class NormKind { layernorm, rmsnorm };
enum class Activation { gelu, swiglu };
enum class PositionKind { learned, rope };

struct ModelSpec {
  std::string name = "custom";
  int layers = 0;
  int hidden = 0;    // C
  int heads = 0;     // H, query heads
  int kv_heads = 0;  // G, key/value heads (== heads without grouped-query attention)
  int ffn = 0;       // F, MLP inner width (per expert for MoE)
  int vocab = 0;     // V
  int seq_len = 0;   // T, the longest sequence (learned position table size)
  bool tied_embeddings = true;
  bool bias = true;  // biases on linear layers and norms (GPT-2: yes; Llama: no)
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu;
  PositionKind position = PositionKind::learned;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  int experts = 0;  // 0: dense MLP; otherwise experts per MoE layer
  int top_k = 0;    // experts each token is routed to

  int head_dim() const { return hidden / heads; }
  bool moe() const { return experts > 0; }
};

// Names of the built-in presets, in a stable order.
const std::vector<std::string>& model_preset_names();
// A preset by name, or an error that suggests the nearest preset name.
Result<ModelSpec> model_preset(const std::string& name);
// A spec from JSON with the preset field names; unknown fields are errors.
Result<ModelSpec> model_from_json(const nlohmann::json& j);
// A preset name, or a path to a JSON file.
Result<ModelSpec> load_model(const std::string& name_or_file);
// Checks the spec's own consistency (positive sizes, hidden % heads, heads % kv_heads, ...).
Status validate_model(const ModelSpec& m);

nlohmann::json model_to_json(const ModelSpec& m);

}  // namespace meshtrain
