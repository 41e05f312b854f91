// The model most simulation tests time: GPT-2 124M at 256 tokens, small
// enough for a test and with every part of a transformer step.
#pragma once

#include <catch2/catch.hpp>

#include "models/model_spec.h"

namespace meshtrain::sim_testing {

inline ModelSpec small_gpt() {
  auto m = model_preset("gpt2-124m");
  REQUIRE(m.ok());
  ModelSpec s = *m;
  s.seq_len = 256;
  return s;
}

}  // namespace meshtrain::sim_testing
