// Which parameters AdamW's decoupled weight decay applies to, and at what
// rate. GPT-2/nanoGPT and Megatron decay the linear layers' weights only
// (norms, biases and embeddings not); some recipes decay the embeddings too,
// and PyTorch's AdamW applied to model.parameters() decays everything.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "models/parameters.h"

namespace meshtrain {

enum class DecayedParams {
  linear,             // ParamInfo::weight_decay: the GEMM weights (attention, MLP, experts, an untied head)
  linear_embeddings,  // those and the embedding tables (tokens, positions, a ViT's class token)
  all,                // every parameter, norms and biases included
};

struct WeightDecay {
  float rate = 0.f;
  DecayedParams params = DecayedParams::linear;
};

// "linear", "linear+embeddings", "all"; an unknown name suggests the nearest.
Result<DecayedParams> parse_decayed_params(std::string_view name);
std::string decayed_params_name(DecayedParams d);

// An embedding table: a token or position embedding, or a class token (a
// name ending in embed.tokens, embed.positions or embed.cls); a patch
// embedding is a linear layer.
bool is_embedding(const ParamInfo& p);

// The rate AdamW applies to `p`: w.rate where w.params covers it, else 0.
float decay_rate(const ParamInfo& p, const WeightDecay& w);

}  // namespace meshtrain
