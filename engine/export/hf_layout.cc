#include "engine/export/hf_layout.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "models/model_io.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

// The meshtrain parameter named `param`, whole, seen as a matrix.
HfTensorMap whole(std::string hf_name, const ParamInfo& p, bool transpose) {
  HfTensorMap t;
  t.hf_name = std::move(hf_name);
  t.param = p.name;
  t.param_numel = p.numel();
  t.rows = p.shape.size() == 2 ? p.shape[0] : 1;
  t.cols = p.shape.back();
  t.columns = t.cols;
  t.transpose = transpose;
  if (p.shape.size() == 1) t.hf_shape = {t.cols};
  else t.hf_shape = transpose ? std::vector<std::int64_t>{t.cols, t.rows} : p.shape;
  return t;
}

// Columns [column, column + columns) of `p` (a weight is transposed to nn.Linear's (out, in); a bias is not).
HfTensorMap part(std::string hf_name, const ParamInfo& p, std::int64_t column, std::int64_t columns,
                 std::int64_t rope_head_dim = 0) {
  HfTensorMap t = whole(std::move(hf_name), p, p.shape.size() == 2);
  t.column = column;
  t.columns = columns;
  t.rope_head_dim = rope_head_dim;
  t.hf_shape = p.shape.size() == 2 ? std::vector<std::int64_t>{columns, t.rows} : std::vector<std::int64_t>{columns};
  return t;
}

// Columns [column, column + columns) of expert e's matrix of `p` (E, rows, cols), transposed to (out, in).
HfTensorMap expert_part(std::string hf_name, const ParamInfo& p, std::int64_t e, std::int64_t column,
                        std::int64_t columns) {
  HfTensorMap t;
  t.hf_name = std::move(hf_name);
  t.param = p.name;
  t.param_numel = p.numel();
  t.rows = p.shape[1];
  t.cols = p.shape[2];
  t.base = e * t.rows * t.cols;
  t.column = column;
  t.columns = columns;
  t.transpose = true;
  t.hf_shape = {columns, t.rows};
  return t;
}

void add_mixtral_experts(const ModelSpec& m, const ParamInfo& p, const std::string& prefix, const std::string& rest,
                         std::vector<HfTensorMap>& out) {
  const std::string moe = prefix + "block_sparse_moe.";
  if (rest == "moe.router") return out.push_back(whole(moe + "gate.weight", p, true));
  for (std::int64_t e = 0; e < m.experts; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", moe, e);
    if (rest == "moe.up") {
      out.push_back(expert_part(expert + "w1.weight", p, e, 0, m.ffn));  // the gate
      out.push_back(expert_part(expert + "w3.weight", p, e, m.ffn, m.ffn));
    } else {
      out.push_back(expert_part(expert + "w2.weight", p, e, 0, m.hidden));  // moe.down
    }
  }
}

// The suffix after "layers.N." of a body parameter name, and N.
bool split_layer_name(const std::string& name, int& layer, std::string& rest) {
  if (name.rfind("layers.", 0) != 0) return false;
  const std::size_t dot = name.find('.', 7);
  layer = std::stoi(name.substr(7, dot - 7));
  rest = name.substr(dot + 1);
  return true;
}

const std::map<std::string, std::string>& gpt2_names() {
  static const std::map<std::string, std::string> names = {
      {"embed.tokens", "wte.weight"},       {"embed.positions", "wpe.weight"},
      {"final_norm.weight", "ln_f.weight"}, {"final_norm.bias", "ln_f.bias"},
      {"norm1.weight", "ln_1.weight"},      {"norm1.bias", "ln_1.bias"},
      {"attn.qkv.weight", "attn.c_attn.weight"}, {"attn.qkv.bias", "attn.c_attn.bias"},
      {"attn.out.weight", "attn.c_proj.weight"}, {"attn.out.bias", "attn.c_proj.bias"},
      {"norm2.weight", "ln_2.weight"},      {"norm2.bias", "ln_2.bias"},
      {"mlp.up.weight", "mlp.c_fc.weight"}, {"mlp.up.bias", "mlp.c_fc.bias"},
      {"mlp.down.weight", "mlp.c_proj.weight"}, {"mlp.down.bias", "mlp.c_proj.bias"}};
  return names;
}

void add_gpt2(const ParamInfo& p, std::vector<HfTensorMap>& out) {
  if (p.name == "head") return out.push_back(whole("lm_head.weight", p, true));
  int layer = 0;
  std::string rest;
  if (split_layer_name(p.name, layer, rest))
    return out.push_back(whole(fmt::format("transformer.h.{}.{}", layer, gpt2_names().at(rest)), p, false));
  out.push_back(whole("transformer." + gpt2_names().at(p.name), p, false));
}

void add_llama_layer(const ModelSpec& m, const ParamInfo& p, const std::string& prefix, const std::string& rest,
                     std::vector<HfTensorMap>& out) {
  const std::string kind = rest.substr(rest.rfind('.') + 1);  // weight or bias
  const std::int64_t D = m.head_dim(), q = std::int64_t{m.heads} * D, kv = std::int64_t{m.kv_heads} * D,
                     F = m.ffn;
  if (rest == "norm1.weight") return out.push_back(whole(prefix + "input_layernorm.weight", p, false));
  if (rest == "norm2.weight") return out.push_back(whole(prefix + "post_attention_layernorm.weight", p, false));
  if (rest.rfind("moe.", 0) == 0) return add_mixtral_experts(m, p, prefix, rest, out);
  if (rest.rfind("attn.qkv.", 0) == 0) {
    out.push_back(part(prefix + "self_attn.q_proj." + kind, p, 0, q, D));
    out.push_back(part(prefix + "self_attn.k_proj." + kind, p, q, kv, D));
    return out.push_back(part(prefix + "self_attn.v_proj." + kind, p, q + kv, kv));
  }
  if (rest.rfind("attn.out.", 0) == 0)
    return out.push_back(whole(prefix + "self_attn.o_proj." + kind, p, kind == "weight"));
  if (rest.rfind("mlp.up.", 0) == 0) {
    out.push_back(part(prefix + "mlp.gate_proj." + kind, p, 0, F));
    return out.push_back(part(prefix + "mlp.up_proj." + kind, p, F, F));
  }
  out.push_back(whole(prefix + "mlp.down_proj." + kind, p, kind == "weight"));  // mlp.down
}

void add_llama(const ModelSpec& m, const ParamInfo& p, std::vector<HfTensorMap>& out) {
  int layer = 0;
  std::string rest;
  if (split_layer_name(p.name, layer, rest))
    return add_llama_layer(m, p, fmt::format("model.layers.{}.", layer), rest, out);
  if (p.name == "embed.tokens") return out.push_back(whole("model.embed_tokens.weight", p, false));
  if (p.name == "final_norm.weight") return out.push_back(whole("model.norm.weight", p, false));
  out.push_back(whole("lm_head.weight", p, true));  // head
}

// A float as its shortest decimal (1e-05, not 9.99999974738e-06), so config.json reads as HF writes it.
double shortest(float v) { return std::stod(fmt::format("{}", v)); }

std::string features(const ModelSpec& m) {
  return fmt::format("norm {}, activation {}, positions {}, bias {}",
                     m.norm == NormKind::layernorm ? "layernorm" : "rmsnorm",
                     m.activation == Activation::gelu ? "gelu" : "swiglu",
                     m.position == PositionKind::learned ? "learned" : "rope", m.bias);
}

// The value transformers takes for `key` when a config.json leaves it out
// (GPT2Config / LlamaConfig defaults); null: the key is required.
nlohmann::json default_of(const std::string& key, const ModelSpec& m, HfArch arch) {
  static const std::map<std::string, nlohmann::json> defaults = {
      {"tie_word_embeddings", true}, {"attention_bias", false}, {"mlp_bias", false},
      {"activation_function", "gelu_new"}, {"hidden_act", "silu"}, {"layer_norm_epsilon", 1e-5},
      {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}};
  if (key == "n_inner") return 4 * m.hidden;  // null or absent: 4 · n_embd
  if (key == "head_dim") return m.hidden / m.heads;
  if (key == "num_key_value_heads") return m.heads;
  if (arch == HfArch::mixtral && key == "rope_theta") return 1e6;
  if (arch == HfArch::mixtral && key == "rms_norm_eps") return 1e-5;
  const auto it = defaults.find(key);
  return it == defaults.end() ? nlohmann::json() : it->second;
}

bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::fabs(x - y) <= 1e-6 * std::fabs(y);
  }
  return a == b;
}

// A model with experts maps to Mixtral when its MoE is Mixtral's: every layer
// routed, top-k weights renormalised, no shared experts, no biases.
Result<HfArch> mixtral_arch(const ModelSpec& m, bool gpt2) {
  std::vector<std::string> why;
  if (gpt2) why.push_back("its layers are GPT-2's, Mixtral's are Llama's (rmsnorm, swiglu, rope)");
  if (m.bias) why.push_back("it has biases");
  if (m.shared_experts > 0) why.push_back(fmt::format("it has {} shared experts", m.shared_experts));
  if (m.moe_every != 1 || m.dense_layers != 0) why.push_back("some of its layers are dense");
  if (!m.renormalize) why.push_back("its top-k weights are not renormalised");
  if (why.empty()) return HfArch::mixtral;
  return make_error("model '{}' has {} experts but no Hugging Face layout: Mixtral's is the only MoE one mapped, "
                    "and {}", m.name, m.experts, fmt::join(why, ", "));
}

}  // namespace

Result<HfArch> hf_arch(const ModelSpec& m) {
  if (m.family != ModelFamily::decoder)
    return make_error("model '{}' is a {} model; Hugging Face layouts are mapped for GPT-2 and Llama decoders only",
                      m.name, family_name(m.family));
  const bool gpt2 =
      m.norm == NormKind::layernorm && m.activation == Activation::gelu && m.position == PositionKind::learned;
  const bool llama =
      m.norm == NormKind::rmsnorm && m.activation == Activation::swiglu && m.position == PositionKind::rope;
  if (!gpt2 && !llama)
    return make_error("model '{}' ({}) is neither GPT-2 (layernorm, gelu, learned positions) nor Llama (rmsnorm, "
                      "swiglu, rope), so it has no Hugging Face layout", m.name, features(m));
  if (gpt2 && !m.bias)
    return make_error("model '{}' is GPT-2 shaped but has no biases; Hugging Face's GPT-2 always has them (set "
                      "\"bias\": true)", m.name);
  if (gpt2 && (m.kv_heads != m.heads || m.head_dim() * m.heads != m.hidden))
    return make_error("model '{}' is GPT-2 shaped with kv_heads {} and head dim {} for {} heads of hidden {}; "
                      "Hugging Face's GPT-2 needs kv_heads == heads and head dim hidden / heads",
                      m.name, m.kv_heads, m.head_dim(), m.heads, m.hidden);
  if (llama && m.head_dim() % 2 != 0)
    return make_error("model '{}' has an odd head dim {}; rotary embeddings rotate pairs", m.name, m.head_dim());
  if (model_io(m).routes_to_experts) return mixtral_arch(m, gpt2);
  return gpt2 ? HfArch::gpt2 : HfArch::llama;
}

std::string_view hf_arch_name(HfArch a) {
  return a == HfArch::gpt2 ? "GPT-2" : a == HfArch::llama ? "Llama" : "Mixtral";
}

std::int64_t HfTensorMap::source(std::int64_t k) const {
  // Element k of the HF tensor is (row r, slice column j), or (j, r) transposed.
  const std::int64_t r = transpose ? k % rows : k / columns, j = transpose ? k / rows : k % columns;
  std::int64_t c = j;
  if (rope_head_dim > 0) {
    // HF column h·D + half·D/2 + i holds meshtrain column h·D + 2i + half.
    const std::int64_t D = rope_head_dim, h = j / D, within = j % D, half = within / (D / 2), i = within % (D / 2);
    c = h * D + 2 * i + half;
  }
  return base + r * cols + column + c;
}

std::vector<HfTensorMap> hf_tensor_maps(const ModelSpec& m, HfArch arch) {
  std::vector<HfTensorMap> out;
  for (const ParamInfo& p : parameter_table(m)) {
    if (arch == HfArch::gpt2) add_gpt2(p, out);
    else add_llama(m, p, out);
  }
  return out;
}

nlohmann::json hf_config(const ModelSpec& m, HfArch arch, SafeDType dtype) {
  const char* torch_dtype = dtype == SafeDType::f32 ? "float32" : dtype == SafeDType::bf16 ? "bfloat16" : "float16";
  if (arch == HfArch::gpt2) {
    // GPT-2's <|endoftext|> is id 50256 of its own vocabulary only.
    const nlohmann::json gpt2_eos = m.vocab == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr);
    // The dropouts are 0: meshtrain's model has none of its own (train --dropout is a run's choice).
    return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"activation_function", "gelu_new"},
            {"attn_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"resid_pdrop", 0.0}, {"initializer_range", 0.02},
            {"layer_norm_epsilon", shortest(m.norm_eps)}, {"n_ctx", m.seq_len}, {"n_positions", m.seq_len},
            {"n_embd", m.hidden}, {"n_head", m.heads}, {"n_layer", m.layers},
            {"n_inner", m.ffn == 4 * m.hidden ? nlohmann::json(nullptr) : nlohmann::json(m.ffn)},
            {"vocab_size", m.vocab}, {"bos_token_id", gpt2_eos}, {"eos_token_id", gpt2_eos},
            {"scale_attn_weights", true}, {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false}, {"tie_word_embeddings", m.tied_embeddings},
            {"torch_dtype", torch_dtype}, {"use_cache", true}};
  }
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
          {"hidden_size", m.hidden}, {"intermediate_size", m.ffn}, {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads}, {"head_dim", m.head_dim()},
          {"max_position_embeddings", m.seq_len}, {"vocab_size", m.vocab}, {"rms_norm_eps", shortest(m.norm_eps)},
          {"rope_theta", shortest(m.rope_theta)}, {"rope_scaling", nullptr}, {"attention_bias", m.bias},
          {"attention_dropout", 0.0}, {"mlp_bias", m.bias}, {"initializer_range", 0.02}, {"pretraining_tp", 1},
          {"bos_token_id", nullptr}, {"eos_token_id", nullptr}, {"tie_word_embeddings", m.tied_embeddings},
          {"torch_dtype", torch_dtype}, {"use_cache", true}};
  if (arch == HfArch::llama) return c;
  // MixtralConfig: Llama's keys without the bias flags, plus the experts.
  for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp"}) c.erase(key);
  c["architectures"] = {"MixtralForCausalLM"};
  c["model_type"] = "mixtral";
  c["num_local_experts"] = m.experts;
  c["num_experts_per_tok"] = m.top_k;
  c["router_aux_loss_coef"] = shortest(m.aux_loss_coeff);
  c["router_jitter_noise"] = 0.0;
  c["output_router_logits"] = false;
  c["sliding_window"] = nullptr;
  return c;
}

Status check_hf_config(const nlohmann::json& config, const ModelSpec& m, const std::string& path) {
  if (!config.is_object()) return make_error("'{}' is not a JSON object", path);
  MT_ASSIGN(const HfArch arch, hf_arch(m));
  const nlohmann::json expected = hf_config(m, arch, SafeDType::f32);
  std::vector<std::string> keys =
      arch == HfArch::gpt2
          ? std::vector<std::string>{"model_type", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
                                     "vocab_size", "layer_norm_epsilon", "activation_function", "tie_word_embeddings"}
          : std::vector<std::string>{"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                     "rms_norm_eps", "rope_theta", "rope_scaling", "hidden_act",
                                     "tie_word_embeddings"};
  if (arch == HfArch::llama) keys.insert(keys.end(), {"attention_bias", "mlp_bias"});
  if (arch == HfArch::mixtral) keys.insert(keys.end(), {"num_local_experts", "num_experts_per_tok"});
  std::vector<std::string> problems;
  for (const std::string& key : keys) {
    const bool given = config.contains(key) && !(key == "n_inner" && config.at(key).is_null());
    nlohmann::json have = given ? config.at(key) : default_of(key, m, arch);
    nlohmann::json want = key == "n_inner" ? nlohmann::json(m.ffn) : expected.at(key);
    if (have == "gelu_pytorch_tanh") have = "gelu_new";  // the same tanh approximation
    if (key == "rope_scaling" && !have.is_null())
      problems.push_back(fmt::format("rope_scaling is {}, which meshtrain does not implement", json_excerpt(have)));
    else if (!same_value(have, want))
      problems.push_back(fmt::format("{} is {}, model '{}' has {}", key,
                                     given || !have.is_null() ? json_excerpt(have) : std::string("missing"), m.name,
                                     json_excerpt(want)));
  }
  if (problems.empty()) return ok_status();
  return make_error("'{}' describes another model than '{}' ({} layout): {}; pass the --model it was exported from",
                    path, m.name, hf_arch_name(arch), fmt::join(problems, "; "));
}

}  // namespace meshtrain
