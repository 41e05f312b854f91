#include "models/model_spec.h"

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "core/names.h"

namespace meshtrain {

namespace {

ModelSpec gpt2(std::string name, int layers, int hidden, int heads) {
  ModelSpec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = m.kv_heads = heads;
  m.ffn = 4 * hidden;
  m.vocab = 50257;
  m.seq_len = 1024;
  return m;
}

// Megatron-LM GPT as in Narayanan et al. 2021 (SC21), Table 1: GPT-2 layout,
// vocabulary 51,200, sequence 2048, tied embeddings.
ModelSpec megatron(std::string name, int layers, int hidden, int heads) {
  ModelSpec m = gpt2(std::move(name), layers, hidden, heads);
  m.vocab = 51200;
  m.seq_len = 2048;
  return m;
}

ModelSpec llama(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn,
                int vocab, int seq_len, float theta) {
  ModelSpec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.seq_len = seq_len;
  m.tied_embeddings = false;
  m.bias = false;
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.norm_eps = 1e-5f;
  m.rope_theta = theta;
  return m;
}

// Sources: GPT-2 (Radford et al. 2019, Table 2 and the released configs);
// GPT-3 (Brown et al. 2020, Table 2.1); Llama 2 (Touvron et al. 2023, released
// params.json); Llama 3 (Dubey et al. 2024, Table 3); Megatron (Narayanan et al. 2021, Table 1).
const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> table = [] {
    std::map<std::string, ModelSpec> t;
    auto add = [&](ModelSpec m) { t.emplace(m.name, std::move(m)); };
    ModelSpec tiny = gpt2("tiny", 4, 64, 4);
    tiny.vocab = 256;
    tiny.seq_len = 64;
    add(tiny);
    add(gpt2("gpt2-124m", 12, 768, 12));
    add(gpt2("gpt2-350m", 24, 1024, 16));
    add(gpt2("gpt2-774m", 36, 1280, 20));
    add(gpt2("gpt2-1.5b", 48, 1600, 25));
    ModelSpec gpt3 = gpt2("gpt3-175b", 96, 12288, 96);
    gpt3.seq_len = 2048;
    add(gpt3);
    add(llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.f));
    add(llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.f));
    add(llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.f));
    add(llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.f));
    add(llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.f));
    add(megatron("megatron-1.7b", 24, 2304, 24));
    add(megatron("megatron-3.6b", 30, 3072, 32));
    add(megatron("megatron-7.5b", 36, 4096, 32));
    add(megatron("megatron-18.4b", 40, 6144, 48));
    add(megatron("megatron-39.1b", 48, 8192, 64));
    add(megatron("megatron-76.1b", 60, 10240, 80));
    add(megatron("megatron-145.6b", 80, 12288, 96));
    add(megatron("megatron-310.1b", 96, 16384, 128));
    add(megatron("megatron-529.6b", 105, 20480, 128));
    add(megatron("megatron-1t", 128, 25600, 160));
    return t;
  }();
  return table;
}

template <class E>
struct EnumNames {
  std::vector<std::pair<E, std::string>> items;
  std::string name(E e) const {
    for (auto& [k, v] : items)
      if (k == e) return v;
    return "?";
  }
  Result<E> parse(const std::string& field, const std::string& s) const {
    std::vector<std::string> valid;
    for (auto& [k, v] : items) {
      if (v == s) return k;
      valid.push_back(v);
    }
    return Error(unknown_name_message(field, s, valid));
  }
};

const EnumNames<NormKind> kNorms{{{NormKind::layernorm, "layernorm"}, {NormKind::rmsnorm, "rmsnorm"}}};
const EnumNames<Activation> kActivations{{{Activation::gelu, "gelu"}, {Activation::swiglu, "swiglu"}}};
const EnumNames<PositionKind> kPositions{{{PositionKind::learned, "learned"}, {PositionKind::rope, "rope"}}};

const std::vector<std::string> kFields = {
    "name",   "layers", "hidden",          "heads", "kv_heads",   "ffn",        "vocab",   "seq_len",
    "tied_embeddings", "bias", "norm", "activation", "position", "norm_eps", "rope_theta",
    "experts", "top_k"};

// The range of each integer field of a model file.
IntRange model_field_range(std::string_view key) {
  if (key == "layers") return {1, 1 << 16};
  if (key == "hidden") return {1, 1 << 20};
  if (key == "heads" || key == "kv_heads") return {1, 1 << 16};
  if (key == "ffn") return {1, 1 << 22};
  if (key == "vocab" || key == "seq_len") return {1, 1 << 24};
  return {0, 1 << 16};  // experts, top_k and other counts
}
const RealRange kNormEpsRange{1e-20, 1};  // a float, and positive
const RealRange kRopeThetaRange{0, 1e12, true, false};

}  // namespace

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (auto& [k, v] : presets()) n.push_back(k);
    return n;
  }();
  return names;
}

Result<ModelSpec> model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) return Error(unknown_name_message("model", name, model_preset_names()));
  return it->second;
}

Result<ModelSpec> model_from_json(const nlohmann::json& j) {
  MT_ASSIGN(const JsonFields f, JsonFields::of(j, "model field",
                                              "a model spec must be a JSON object with fields such as layers, hidden, heads"));
  MT_TRY(f.check_known(kFields));
  ModelSpec m;
  // Every number is bounded (core/bounded.h): far above any real model, far
  // below where a count of parameters, FLOPs or bytes would overflow.
  auto get_int = [&](const char* key, int& out) { return f.get_int(key, model_field_range(key), out); };
  auto get_float = [&](const char* key, float& out) {
    return f.get_real(key, std::string_view(key) == "norm_eps" ? kNormEpsRange : kRopeThetaRange, out);
  };
  auto get_bool = [&](const char* key, bool& out) { return f.get_bool(key, out); };
  auto get_string = [&](const char* key, std::string& out) { return f.get_string(key, out); };
  MT_TRY(get_string("name", m.name));
  MT_TRY(get_int("layers", m.layers));
  MT_TRY(get_int("hidden", m.hidden));
  MT_TRY(get_int("heads", m.heads));
  m.kv_heads = m.heads;
  MT_TRY(get_int("kv_heads", m.kv_heads));
  m.ffn = 4 * m.hidden;
  MT_TRY(get_int("ffn", m.ffn));
  MT_TRY(get_int("vocab", m.vocab));
  MT_TRY(get_int("seq_len", m.seq_len));
  MT_TRY(get_bool("tied_embeddings", m.tied_embeddings));
  MT_TRY(get_bool("bias", m.bias));
  MT_TRY(get_float("norm_eps", m.norm_eps));
  MT_TRY(get_float("rope_theta", m.rope_theta));
  MT_TRY(get_int("experts", m.experts));
  MT_TRY(get_int("top_k", m.top_k));
  std::string s;
  if (j.contains("norm")) {
    MT_TRY(get_string("norm", s));
    MT_ASSIGN(m.norm, kNorms.parse("norm", s));
  }
  if (j.contains("activation")) {
    MT_TRY(get_string("activation", s));
    MT_ASSIGN(m.activation, kActivations.parse("activation", s));
  }
  if (j.contains("position")) {
    MT_TRY(get_string("position", s));
    MT_ASSIGN(m.position, kPositions.parse("position", s));
  }
  MT_TRY(validate_model(m));
  return m;
}

Result<ModelSpec> load_model(const std::string& name_or_file) {
  if (presets().count(name_or_file)) return model_preset(name_or_file);
  bool looks_like_file = name_or_file.find('/') != std::string::npos ||
                         name_or_file.find(".json") != std::string::npos;
  std::error_code ec;
  if (!looks_like_file && !std::filesystem::exists(name_or_file, ec))
    return Error(unknown_name_message("model", name_or_file, model_preset_names()) +
                 "; or pass a path to a JSON model file");
  MT_ASSIGN(const nlohmann::json j, load_json_file(name_or_file, "model file"));
  auto m = model_from_json(j);
  m.context(fmt::format("model file '{}'", name_or_file));
  return m;
}

Status validate_model(const ModelSpec& m) {
  auto positive = [&](const char* what, int v) -> Status {
    if (v <= 0) return make_error("model '{}': {} must be positive, got {}", m.name, what, v);
    return {};
  };
  MT_TRY(positive("layers", m.layers));
  MT_TRY(positive("hidden", m.hidden));
  MT_TRY(positive("heads", m.heads));
  MT_TRY(positive("kv_heads", m.kv_heads));
  MT_TRY(positive("ffn", m.ffn));
  MT_TRY(positive("vocab", m.vocab));
  MT_TRY(positive("seq_len", m.seq_len));
  if (m.hidden % m.heads != 0)
    return make_error("model '{}': hidden {} is not divisible by heads {}; choose hidden as a multiple of heads",
                      m.name, m.hidden, m.heads);
  if (m.heads % m.kv_heads != 0)
    return make_error("model '{}': heads {} is not divisible by kv_heads {}; grouped-query attention needs "
                      "heads = kv_heads × group size", m.name, m.heads, m.kv_heads);
  if (m.position == PositionKind::rope && m.head_dim() % 2 != 0)
    return make_error("model '{}': rope needs an even head dimension, got {}", m.name, m.head_dim());
  if (m.experts < 0 || m.top_k < 0)
    return make_error("model '{}': experts and top_k must not be negative", m.name);
  if (m.experts > 0 && (m.top_k < 1 || m.top_k > m.experts))
    return make_error("model '{}': top_k must be in 1..experts ({}), got {}", m.name, m.experts, m.top_k);
  if (m.experts == 0 && m.top_k != 0)
    return make_error("model '{}': top_k {} given without experts; set experts or drop top_k", m.name, m.top_k);
  if (m.norm == NormKind::layernorm && !m.bias)
    return make_error("model '{}': layernorm without bias is not supported; use \"norm\": \"rmsnorm\" or \"bias\": true",
                      m.name);
  if (!(m.norm_eps > 0)) return make_error("model '{}': norm_eps must be positive", m.name);
  return {};
}

nlohmann::json model_to_json(const ModelSpec& m) {
  nlohmann::json j = {{"name", m.name},         {"layers", m.layers},
                      {"hidden", m.hidden},     {"heads", m.heads},
                      {"kv_heads", m.kv_heads}, {"ffn", m.ffn},
                      {"vocab", m.vocab},       {"seq_len", m.seq_len},
                      {"tied_embeddings", m.tied_embeddings},
                      {"bias", m.bias},
                      {"norm", kNorms.name(m.norm)},
                      {"activation", kActivations.name(m.activation)},
                      {"position", kPositions.name(m.position)},
                      {"norm_eps", m.norm_eps},
                      {"rope_theta", m.rope_theta}};
  if (m.moe()) {
    j["experts"] = m.experts;
    j["top_k"] = m.top_k;
  }
  return j;
}

}  // namespace meshtrain
