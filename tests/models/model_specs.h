// Model specs the tests share: a preset that must exist, Llama's layer
// choices on any spec, and `tiny` cut to two layers with its Llama sibling.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "models/model_spec.h"

namespace meshtrain::testing {

// The preset `name`; the test case fails where there is none.
inline ModelSpec preset(const std::string& name) {
  auto m = model_preset(name);
  REQUIRE(m.ok());
  return *m;
}

// `m` with Llama's layers: RMSNorm, SwiGLU, rope, no biases, an untied head.
inline ModelSpec llama_layers(ModelSpec m) {
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.tied_embeddings = false;
  m.bias = false;
  return m;
}

// `tiny` with 2 layers of 16 tokens: hidden 64, 4 heads, vocab 256, tied.
inline ModelSpec tiny_gpt2() {
  ModelSpec m = *model_preset("tiny");
  m.layers = 2;
  m.seq_len = 16;
  return m;
}

// Its Llama sibling (llama_layers): SwiGLU of width 96, 2 kv heads.
inline ModelSpec tiny_llama() {
  ModelSpec m = llama_layers(tiny_gpt2());
  m.name = "tiny-llama";
  m.kv_heads = 2;
  m.ffn = 96;
  return m;
}

}  // namespace meshtrain::testing
