#include "engine/parallel/weight_decay.h"

#include "core/names.h"

namespace meshtrain {

namespace {

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace

Result<DecayedParams> parse_decayed_params(std::string_view name) {
  if (name == "linear") return DecayedParams::linear;
  if (name == "linear+embeddings") return DecayedParams::linear_embeddings;
  if (name == "all") return DecayedParams::all;
  return Error(unknown_name_message("--weight-decay-params", name, {"linear", "linear+embeddings", "all"}));
}

std::string decayed_params_name(DecayedParams d) {
  switch (d) {
    case DecayedParams::linear: return "linear";
    case DecayedParams::linear_embeddings: return "linear+embeddings";
    case DecayedParams::all: return "all";
  }
  return "linear";
}

bool is_embedding(const ParamInfo& p) {
  return ends_with(p.name, "embed.tokens") || ends_with(p.name, "embed.positions") || ends_with(p.name, "embed.cls");
}

float decay_rate(const ParamInfo& p, const WeightDecay& w) {
  switch (w.params) {
    case DecayedParams::all: return w.rate;
    case DecayedParams::linear_embeddings: return p.weight_decay || is_embedding(p) ? w.rate : 0.f;
    case DecayedParams::linear: return p.weight_decay ? w.rate : 0.f;
  }
  return 0.f;
}

}  // namespace meshtrain
