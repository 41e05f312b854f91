// The small GPT-2, Llama and Mixtral shaped models the export tests map
// (the first two: tests/models/model_specs.h), and parameters for them.
#pragma once

#include <random>

#include "engine/export/hf_export.h"
#include "models/parameters.h"
#include "tests/models/model_specs.h"

namespace meshtrain::testing {

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
