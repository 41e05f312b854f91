// The small GPT-2 and Llama shaped models the export tests map, and
// parameters for them.
#pragma once

#include <random>

#include "engine/export/hf_export.h"
#include "models/parameters.h"

namespace meshtrain::testing {

// `tiny` with 2 layers of 16 tokens: hidden 64, 4 heads, vocab 256, tied.
inline ModelSpec tiny_gpt2() {
  ModelSpec m = *model_preset("tiny");
  m.layers = 2;
  m.seq_len = 16;
  return m;
}

// Its Llama sibling: RMSNorm, SwiGLU of width 96, rope, 2 kv heads, untied, no biases.
inline ModelSpec tiny_llama() {
  ModelSpec m = tiny_gpt2();
  m.name = "tiny-llama";
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.tied_embeddings = false;
  m.bias = false;
  m.kv_heads = 2;
  m.ffn = 96;
  return m;
}

// Its Mixtral sibling: 4 SwiGLU experts of width 32, top 2, renormalised.
inline ModelSpec tiny_mixtral() {
  ModelSpec m = tiny_llama();
  m.name = "tiny-mixtral";
  m.ffn = 32;
  m.experts = 4;
  m.top_k = 2;
  return m;
}

// Every parameter of `m`, full, of distinct normal values.
inline ParamMap random_params(const ModelSpec& m, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  ParamMap out;
  for (const ParamInfo& p : parameter_table(m)) {
    std::vector<float>& v = out[p.name];
    v.resize(static_cast<std::size_t>(p.numel()));
    for (float& x : v) x = normal(rng);
  }
  return out;
}

}  // namespace meshtrain::testing
