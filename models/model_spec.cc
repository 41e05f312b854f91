#include "models/model_spec.h"

#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "core/names.h"
#include "models/vqa_spec.h"

namespace meshtrain {

void derive_model_fields(ModelSpec& m) {
  if (!m.vision()) return;
  if (m.vqa()) return derive_vqa_fields(m);
  const int grid = m.patch_grid();
  if (m.family == ModelFamily::vit) {
    m.seq_len = 1 + grid * grid;  // the class token and the patches
    return;
  }
  m.seq_len = grid * grid;
  const int stages = static_cast<int>(m.depths.size());
  m.layers = stages > 0 ? stages - 1 : 0;  // the patch mergings between stages
  for (int d : m.depths) m.layers += d;
  if (!m.stage_heads.empty()) m.heads = m.kv_heads = m.stage_heads.front();
}

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

// ViT (Dosovitskiy et al. 2021, Table 1): 224² RGB images, 1000 classes,
// LayerNorm eps 1e-6 as in the released models.
ModelSpec vit(std::string name, int layers, int hidden, int heads, int ffn, int patch) {
  ModelSpec m;
  m.name = std::move(name);
  m.family = ModelFamily::vit;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = m.kv_heads = heads;
  m.ffn = ffn;
  m.image_size = 224;
  m.patch = patch;
  m.channels = 3;
  m.classes = 1000;
  m.norm_eps = 1e-6f;
  m.tied_embeddings = false;
  return m;
}

// Swin (Liu et al. 2021, Sec. 3.3): patch 4, window 7, MLP ratio 4, 224² RGB, 1000 classes.
ModelSpec swin(std::string name, int hidden, std::vector<int> depths, std::vector<int> heads) {
  ModelSpec m;
  m.name = std::move(name);
  m.family = ModelFamily::swin;
  m.hidden = hidden;
  m.ffn = 4 * hidden;
  m.depths = std::move(depths);
  m.stage_heads = std::move(heads);
  m.heads = m.kv_heads = m.stage_heads.front();
  m.image_size = 224;
  m.patch = 4;
  m.window = 7;
  m.channels = 3;
  m.classes = 1000;
  m.tied_embeddings = false;
  return m;
}

// Mixture-of-experts decoders: Llama-style layers whose MLP is `experts`
// SwiGLU experts of width `ffn`, top_k of them per token, renormalised.
ModelSpec moe(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn, int experts, int top_k,
              int vocab, float aux_loss_coeff) {
  ModelSpec m = llama(std::move(name), layers, hidden, heads, kv_heads, ffn, vocab, 4096, 1e6f);
  m.experts = experts;
  m.top_k = top_k;
  m.aux_loss_coeff = aux_loss_coeff;
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
    // Mixture of experts. Mixtral (Jiang et al. 2024 and the released
    // config.json): 8 experts, top 2, router_aux_loss_coef 0.02 (8x7B) and
    // 0.001 (8x22B). Qwen3-30B-A3B (Qwen3 technical report, Table 2, and
    // config.json): 48 layers, 128 experts of width 768, top 8, head_dim
    // 128, norm_topk_prob, aux coefficient 0.001; its q/k RMSNorms (256
    // parameters a layer) are not modelled. seq_len is the training
    // sequence of Megatron-Core's Mixtral recipes and of Qwen3's first
    // pre-training stage, 4096, not the models' longest context.
    add(moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 8, 2, 32000, 0.02f));
    add(moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 8, 2, 32768, 0.001f));
    ModelSpec qwen3 = moe("qwen3-30b-a3b", 48, 2048, 32, 4, 768, 128, 8, 151936, 0.001f);
    qwen3.head_dim_size = 128;
    qwen3.norm_eps = 1e-6f;
    add(qwen3);
    // The mission's example (8 experts, d_model 2048); the rest is ours, in
    // Mixtral's proportions: 24 layers, 16 heads with 4 kv heads, experts of
    // width 5632 (2.75 d_model), top 2: 7.0B parameters, 2.0B active.
    add(moe("moe-seed", 24, 2048, 16, 4, 5632, 8, 2, 32000, 0.01f));
    // Tests and the training study: `tiny` with 8 GELU experts of width 128,
    // top 2, so a token's active MLP (2 · 128) is tiny's dense 256.
    ModelSpec tiny_moe = tiny;
    tiny_moe.name = "tiny-moe";
    tiny_moe.ffn = 128;
    tiny_moe.experts = 8;
    tiny_moe.top_k = 2;
    add(tiny_moe);
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
    add(vit("vit-b16", 12, 768, 12, 3072, 16));
    add(vit("vit-l16", 24, 1024, 16, 4096, 16));
    add(vit("vit-h14", 32, 1280, 16, 5120, 14));
    add(swin("swin-t", 96, {2, 2, 6, 2}, {3, 6, 12, 24}));
    add(swin("swin-s", 96, {2, 2, 18, 2}, {3, 6, 12, 24}));
    add(swin("swin-b", 128, {2, 2, 18, 2}, {4, 8, 16, 32}));
    add(swin("swin-l", 192, {2, 2, 18, 2}, {6, 12, 24, 48}));
    // Tests: a ViT on 8×8 grey images (16 patches of 2×2) and a Swin on
    // 12×12 grey images (a 6×6 grid, windows of 3, an odd grid to merge).
    ModelSpec vit_tiny = vit("vit-tiny", 2, 32, 4, 64, 2);
    vit_tiny.image_size = 8, vit_tiny.channels = 1, vit_tiny.classes = 10;
    add(vit_tiny);
    ModelSpec swin_micro = swin("swin-micro", 16, {2, 2, 2}, {4, 4, 8});
    swin_micro.image_size = 12, swin_micro.patch = 2, swin_micro.window = 3;
    swin_micro.channels = 1, swin_micro.classes = 10;
    add(swin_micro);
    // Fashion-MNIST (28×28 grey, 10 classes): patches of 2 make a 14×14 grid,
    // windows of 7 (4 windows, then shifted), then grids 7, 4 (7 padded) and 2.
    ModelSpec swin_fmnist = swin("swin-fmnist", 32, {2, 2, 4, 2}, {2, 4, 8, 16});
    swin_fmnist.image_size = 28, swin_fmnist.patch = 2, swin_fmnist.channels = 1, swin_fmnist.classes = 10;
    add(swin_fmnist);
    // A ViT for the same images: 7×7 patches of 4×4, a class token.
    ModelSpec vit_fmnist = vit("vit-fmnist", 6, 64, 4, 256, 4);
    vit_fmnist.image_size = 28, vit_fmnist.channels = 1, vit_fmnist.classes = 10;
    add(vit_fmnist);
    for (ModelSpec& m : vqa_presets()) add(std::move(m));
    for (auto& [name, m] : t) derive_model_fields(m);
    return t;
  }();
  return table;
}

const EnumNames<NormKind> kNorms{{{NormKind::layernorm, "layernorm"}, {NormKind::rmsnorm, "rmsnorm"}}};
const EnumNames<Activation> kActivations{{{Activation::gelu, "gelu"}, {Activation::swiglu, "swiglu"}}};
const EnumNames<PositionKind> kPositions{{{PositionKind::learned, "learned"}, {PositionKind::rope, "rope"}}};
const EnumNames<ModelFamily> kFamilies{
    {{ModelFamily::decoder, "decoder"}, {ModelFamily::vit, "vit"}, {ModelFamily::swin, "swin"},
     {ModelFamily::vqa, "vqa"}}};

const std::vector<std::string> kFields = {
    "name",   "family",  "layers", "hidden",          "heads", "kv_heads",   "ffn",        "vocab",   "seq_len",
    "tied_embeddings", "bias", "norm", "activation", "position", "norm_eps", "rope_theta",
    "experts", "top_k", "shared_experts", "moe_every", "dense_layers", "dense_ffn", "renormalize",
    "capacity_factor", "aux_loss_coeff", "z_loss_coeff", "head_dim", "sliding_window", "window_pattern", "attention_sinks", "image_size", "patch", "channels", "classes", "window", "depths", "stage_heads",
    "vision", "projector", "decoder_layers", "question_len"};

// Fields a family does not read, and why: given, they would be silently ignored.
Status check_family_fields(const nlohmann::json& j, ModelFamily family) {
  struct Rule {
    const char* field;
    bool decoder, vit, swin;  // read by
    const char* why;
  };
  static const Rule kRules[] = {
      {"vocab", true, false, false, "vision models classify images into `classes`"},
      {"seq_len", true, false, false, "a vision model's tokens follow from image_size and patch"},
      {"layers", true, true, false, "a Swin model's layers follow from its depths"},
      {"heads", true, true, false, "a Swin model gives the heads of every stage in stage_heads"},
      {"kv_heads", true, false, false, "grouped-query attention is a decoder option"},
      {"tied_embeddings", true, false, false, "a vision model has no token embedding to tie"},
      {"position", true, false, false, "ViT learns its position embeddings, Swin uses relative position biases"},
      {"rope_theta", true, false, false, "only rope positions read it"},
      {"image_size", false, true, true, "decoders read token ids"},
      {"patch", false, true, true, "decoders read token ids"},
      {"channels", false, true, true, "decoders read token ids"},
      {"classes", false, true, true, "decoders predict the next token over `vocab`"},
      {"window", false, false, true, "only Swin attends within windows"},
      {"depths", false, false, true, "only Swin has stages; give `layers`"},
      {"stage_heads", false, false, true, "only Swin has stages; give `heads`"},
      {"experts", true, false, false, "mixture-of-experts layers are a decoder option"},
      {"top_k", true, false, false, "mixture-of-experts layers are a decoder option"},
      {"head_dim", true, false, false, "a vision model's heads split its width evenly"},
      {"sliding_window", true, false, false, "sliding-window attention is a decoder option"},
      {"window_pattern", true, false, false, "sliding-window attention is a decoder option"},
      {"attention_sinks", true, false, false, "attention sinks are a decoder option"},
      {"vision", false, false, false, "only a vqa model has a vision encoder"},
      {"projector", false, false, false, "only a vqa model has a projector"},
      {"decoder_layers", false, false, false, "only a vqa model has a decoder besides an encoder; give `layers`"},
      {"question_len", false, false, false, "only a vqa model reads questions"},
  };
  for (const Rule& r : kRules) {
    const bool reads = family == ModelFamily::decoder ? r.decoder : family == ModelFamily::vit ? r.vit : r.swin;
    if (!reads && j.contains(r.field))
      return make_error("model field '{}' does not apply to a {} model ({}); remove it", r.field,
                        kFamilies.name(family), r.why);
  }
  return ok_status();
}

// The fields a family has no default for: absent, they are named as missing
// (not as "must be positive, got 0", a value the user never wrote).
Status require_family_fields(const JsonFields& f, ModelFamily family) {
  switch (family) {
    case ModelFamily::decoder:
      return f.require({"layers", "hidden", "heads", "vocab", "seq_len"},
                       "a decoder model needs layers, hidden, heads, vocab and seq_len");
    case ModelFamily::vit:
      return f.require({"layers", "hidden", "heads", "image_size", "patch", "channels", "classes"},
                       "a vit model needs layers, hidden, heads, image_size, patch, channels and classes");
    case ModelFamily::swin:
      return f.require({"hidden", "image_size", "patch", "channels", "classes", "window", "depths", "stage_heads"},
                       "a swin model needs hidden, image_size, patch, channels, classes, window, depths and "
                       "stage_heads");
    case ModelFamily::vqa:
      break;  // models/vqa_spec.cc reads its own
  }
  return ok_status();
}

// Quantities derived from the fields, computed in 64 bits before they are
// stored in an int: each is checked against the range the field it stands
// for would have, and an error names the fields the user set.
Status check_derived_sizes(const ModelSpec& m) {
  if (m.family != ModelFamily::vit && m.family != ModelFamily::swin) return ok_status();
  if (m.patch > m.image_size)
    return make_error("model field 'patch' {} is larger than image_size {}; a patch must fit in the image", m.patch,
                      m.image_size);
  const std::int64_t grid = m.image_size / m.patch;
  const std::int64_t tokens = grid * grid + (m.family == ModelFamily::vit ? 1 : 0);
  const IntRange limit = model_field_range("seq_len");
  if (tokens > limit.max)
    return make_error("model fields image_size {} and patch {} make a {}x{} grid of patches: {} tokens, more than "
                      "the {} a model may have; use a larger patch or a smaller image",
                      m.image_size, m.patch, grid, grid, tokens, limit.max);
  // Swin doubles its width at every stage: the last stage's must stay a valid hidden size.
  const std::int64_t widest = m.depths.empty() ? m.hidden : std::int64_t{m.hidden} << std::min<std::size_t>(m.depths.size() - 1, 40);
  if (m.family == ModelFamily::swin && widest > model_field_range("hidden").max)
    return make_error("model fields hidden {} and depths ({} stages) make the last stage {} wide (hidden doubles at "
                      "each stage), more than the {} a model may have; use fewer stages or a smaller hidden",
                      m.hidden, m.depths.size(), widest, model_field_range("hidden").max);
  return ok_status();
}

const RealRange kNormEpsRange{1e-20, 1};  // a float, and positive
const RealRange kRopeThetaRange{0, 1e12, true, false};
// Capacity factor (0: dropless) and the router's loss coefficients.
const RealRange kMoeCoefficientRange{0, 1e6};

}  // namespace

IntRange model_field_range(std::string_view key) {
  if (key == "layers") return {1, 1 << 16};
  if (key == "hidden") return {1, 1 << 20};
  if (key == "heads" || key == "kv_heads") return {1, 1 << 16};
  if (key == "ffn") return {1, 1 << 22};
  if (key == "vocab" || key == "seq_len") return {1, 1 << 24};
  if (key == "sliding_window") return {0, 1 << 24};
  if (key == "image_size") return {1, 1 << 16};
  if (key == "patch" || key == "channels" || key == "window") return {1, 1 << 12};
  if (key == "classes") return {1, 1 << 24};
  if (key == "decoder_layers") return {1, 1 << 16};
  if (key == "question_len") return {1, 1 << 24};
  if (key == "depths" || key == "stage_heads") return {1, 1 << 16};
  return {0, 1 << 16};  // experts, top_k and other counts
}

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

namespace {

// The typed, bounded reads of one model file's fields. Every number is
// bounded (core/bounded.h): far above any real model, far below where a
// count of parameters, FLOPs or bytes would overflow.
class ModelFields {
 public:
  explicit ModelFields(const JsonFields& f) : f_(f) {}
  Status get(const char* key, int& out) const { return f_.get_int(key, model_field_range(key), out); }
  Status get(const char* key, float& out) const {
    const std::string_view k = key;
    const RealRange& range = k == "norm_eps" ? kNormEpsRange : k == "rope_theta" ? kRopeThetaRange : kMoeCoefficientRange;
    return f_.get_real(key, range, out);
  }
  Status get(const char* key, bool& out) const { return f_.get_bool(key, out); }
  Status get(const char* key, std::string& out) const { return f_.get_string(key, out); }
  Status get(const char* key, std::vector<int>& out) const {
    if (!f_.has(key)) return {};
    const auto& list = f_.at(key);
    if (!list.is_array() || list.size() > 64)
      return make_error("model field '{}' must be a list of at most 64 integers, got {}", key, list.dump());
    out.clear();
    for (const auto& v : list) {
      MT_ASSIGN(const std::int64_t x, parse_int(fmt::format("model field '{}'", key), v.dump(), model_field_range(key)));
      out.push_back(static_cast<int>(x));
    }
    return {};
  }
  // An enumerated field (norm, activation, position, family), when present.
  template <class E, class Names>
  Status choice(const char* key, const Names& names, E& out) const {
    return f_.get_choice(key, names, out);
  }

 private:
  const JsonFields& f_;
};

// The vision fields (ViT, Swin) with the released models' defaults.
Status read_vision_fields(const ModelFields& r, ModelSpec& m) {
  if (m.vision()) {
    m.norm_eps = m.family == ModelFamily::vit ? 1e-6f : 1e-5f;  // the released models' LayerNorm eps
    m.tied_embeddings = false;
  }
  MT_TRY(r.get("image_size", m.image_size));
  MT_TRY(r.get("patch", m.patch));
  MT_TRY(r.get("channels", m.channels));
  MT_TRY(r.get("classes", m.classes));
  MT_TRY(r.get("window", m.window));
  MT_TRY(r.get("depths", m.depths));
  MT_TRY(r.get("stage_heads", m.stage_heads));
  if (!m.stage_heads.empty()) m.heads = m.stage_heads.front();
  return {};
}

// The transformer's shape and attention: layers, widths, vocabulary, norms, positions, windows, sinks.
Status read_transformer_fields(const ModelFields& r, ModelSpec& m) {
  MT_TRY(r.get("layers", m.layers));
  MT_TRY(r.get("hidden", m.hidden));
  MT_TRY(r.get("heads", m.heads));
  m.kv_heads = m.heads;
  MT_TRY(r.get("kv_heads", m.kv_heads));
  m.ffn = 4 * m.hidden;
  MT_TRY(r.get("ffn", m.ffn));
  MT_TRY(r.get("vocab", m.vocab));
  MT_TRY(r.get("seq_len", m.seq_len));
  MT_TRY(r.get("tied_embeddings", m.tied_embeddings));
  MT_TRY(r.get("bias", m.bias));
  MT_TRY(r.get("norm_eps", m.norm_eps));
  MT_TRY(r.get("rope_theta", m.rope_theta));
  MT_TRY(r.get("head_dim", m.head_dim_size));
  MT_TRY(r.get("sliding_window", m.sliding_window));
  MT_TRY(r.get("window_pattern", m.window_pattern));
  return r.get("attention_sinks", m.attention_sinks);
}

// The mixture-of-experts fields; refused without experts, where they would be silently ignored.
Status read_moe_fields(const ModelFields& r, ModelSpec& m) {
  MT_TRY(r.get("experts", m.experts));
  MT_TRY(r.get("top_k", m.top_k));
  MT_TRY(r.get("shared_experts", m.shared_experts));
  MT_TRY(r.get("moe_every", m.moe_every));
  MT_TRY(r.get("dense_layers", m.dense_layers));
  MT_TRY(r.get("dense_ffn", m.dense_ffn));
  MT_TRY(r.get("renormalize", m.renormalize));
  MT_TRY(r.get("capacity_factor", m.capacity_factor));
  MT_TRY(r.get("aux_loss_coeff", m.aux_loss_coeff));
  return r.get("z_loss_coeff", m.z_loss_coeff);
}

Status check_moe_fields_have_experts(const nlohmann::json& j, const ModelSpec& m) {
  if (j.contains("experts") && m.experts != 0) return {};
  for (const char* f : {"shared_experts", "moe_every", "dense_layers", "dense_ffn", "renormalize",
                        "capacity_factor", "aux_loss_coeff", "z_loss_coeff"})
    if (j.contains(f))
      return make_error("model field '{}' given without experts; set experts (and top_k) or remove it", f);
  return {};
}

}  // namespace

Result<ModelSpec> model_from_json(const nlohmann::json& j) {
  MT_ASSIGN(const JsonFields f, JsonFields::of(j, "model field",
                                              "a model spec must be a JSON object with fields such as layers, hidden, heads"));
  MT_TRY(f.check_known(kFields));
  const ModelFields r(f);
  ModelSpec m;
  MT_TRY(r.get("name", m.name));
  MT_TRY(r.choice("family", kFamilies, m.family));
  // A VQA model's own fields (models/vqa_spec.h) and the ones it refuses.
  MT_TRY(m.vqa() ? read_vqa_fields(j, m) : check_family_fields(j, m.family));
  MT_TRY(read_vision_fields(r, m));
  MT_TRY(read_transformer_fields(r, m));
  MT_TRY(read_moe_fields(r, m));
  // Missing fields after the present ones' types: a wrong value is named before what is absent.
  MT_TRY(require_family_fields(f, m.family));
  MT_TRY(check_moe_fields_have_experts(j, m));
  MT_TRY(r.choice("norm", kNorms, m.norm));
  MT_TRY(r.choice("activation", kActivations, m.activation));
  MT_TRY(r.choice("position", kPositions, m.position));
  MT_TRY(check_derived_sizes(m));
  derive_model_fields(m);
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

Status validate_image_fields(const ModelSpec& m) {
  for (const auto& [what, v] : {std::pair{"image_size", m.image_size}, {"patch", m.patch}, {"channels", m.channels}})
    if (v <= 0) return make_error("model '{}': {} must be positive, got {}", m.name, what, v);
  if (m.image_size % m.patch != 0)
    return make_error("model '{}': image_size {} is not divisible by patch {}; the patches must tile the image",
                      m.name, m.image_size, m.patch);
  return ok_status();
}

namespace {

Status validate_vision(const ModelSpec& m) {
  if (m.vqa()) return validate_vqa(m);
  auto positive = [&](const char* what, int v) -> Status {
    if (v <= 0) return make_error("model '{}': {} must be positive, got {}", m.name, what, v);
    return {};
  };
  MT_TRY(validate_image_fields(m));
  MT_TRY(positive("classes", m.classes));
  if (m.family == ModelFamily::vit) return ok_status();
  MT_TRY(positive("window", m.window));
  if (m.depths.empty() || m.depths.size() != m.stage_heads.size())
    return make_error("model '{}': depths ({} stages) and stage_heads ({} stages) must list the same, non-zero "
                      "number of stages",
                      m.name, m.depths.size(), m.stage_heads.size());
  int grid = m.patch_grid();
  for (std::size_t i = 0; i < m.depths.size(); ++i) {
    const int width = m.hidden << i, heads = m.stage_heads[i];
    if (m.depths[i] <= 0 || heads <= 0)
      return make_error("model '{}': stage {} needs positive depth and heads, got {} and {}", m.name, i + 1,
                        m.depths[i], heads);
    if (width % heads != 0)
      return make_error("model '{}': stage {} has width {} (hidden {} · 2^{}), not divisible by its {} heads",
                        m.name, i + 1, width, m.hidden, i, heads);
    // A grid no larger than the window is one window (Liu et al.'s rule).
    if (grid > m.window && grid % m.window != 0)
      return make_error("model '{}': stage {} has a {}×{} token grid, not divisible by window {}; choose image_size, "
                        "patch and window so that every stage's grid is a multiple of the window or at most it",
                        m.name, i + 1, grid, grid, m.window);
    grid = (grid + 1) / 2;
  }
  return ok_status();
}

Status validate_attention_variants(const ModelSpec& m) {
  if ((m.sliding_window != 0 || m.window_pattern != 0 || m.attention_sinks) && m.family != ModelFamily::decoder)
    return make_error("model '{}': sliding_window, window_pattern and attention_sinks are decoder options, not "
                      "for a {} model; remove them", m.name, family_name(m.family));
  if (m.sliding_window < 0)
    return make_error("model '{}': sliding_window must be >= 0 (0: no window), got {}", m.name, m.sliding_window);
  if (m.window_pattern != 0 && m.sliding_window == 0)
    return make_error("model '{}': window_pattern {} given without sliding_window; set sliding_window (the keys a "
                      "local layer reads) or remove window_pattern", m.name, m.window_pattern);
  if (m.window_pattern == 1 || m.window_pattern < 0)
    return make_error("model '{}': window_pattern must be 0 (every layer local) or >= 2 (every P-th layer global), "
                      "got {}; for no local layer remove sliding_window", m.name, m.window_pattern);
  return ok_status();
}

Status validate_moe(const ModelSpec& m) {
  if (m.shared_experts < 0)
    return make_error("model '{}': shared_experts must not be negative, got {}", m.name, m.shared_experts);
  if (m.moe_every < 1) return make_error("model '{}': moe_every must be at least 1, got {}", m.name, m.moe_every);
  if (m.dense_layers < 0 || m.dense_layers >= m.layers)
    return make_error("model '{}': dense_layers {} must be in 0..{} (layers - 1) so that some layer has experts",
                      m.name, m.dense_layers, m.layers - 1);
  if (m.dense_ffn < 0) return make_error("model '{}': dense_ffn must be positive, got {}", m.name, m.dense_ffn);
  if (!(m.capacity_factor >= 0))
    return make_error("model '{}': capacity_factor {} must be >= 0 (0: dropless; e.g. 1.25 keeps 1.25 times an "
                      "expert's even share of a micro-batch's tokens)",
                      m.name, m.capacity_factor);
  if (!(m.aux_loss_coeff >= 0) || !(m.z_loss_coeff >= 0))
    return make_error("model '{}': aux_loss_coeff {} and z_loss_coeff {} must be >= 0", m.name, m.aux_loss_coeff,
                      m.z_loss_coeff);
  return ok_status();
}

}  // namespace

Status validate_model(const ModelSpec& m) {
  auto positive = [&](const char* what, int v) -> Status {
    if (v <= 0) return make_error("model '{}': {} must be positive, got {}", m.name, what, v);
    return {};
  };
  if (m.vision()) MT_TRY(validate_vision(m));
  MT_TRY(positive("layers", m.layers));
  MT_TRY(positive("hidden", m.hidden));
  MT_TRY(positive("heads", m.heads));
  MT_TRY(positive("kv_heads", m.kv_heads));
  MT_TRY(positive("ffn", m.ffn));
  if (!m.vision()) MT_TRY(positive("vocab", m.vocab));
  MT_TRY(positive("seq_len", m.seq_len));
  if (m.head_dim_size == 0 && m.hidden % m.heads != 0)
    return make_error("model '{}': hidden {} is not divisible by heads {}; choose hidden as a multiple of heads "
                      "or give head_dim",
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
  if (m.head_dim_size < 0) return make_error("model '{}': head_dim must be positive, got {}", m.name, m.head_dim_size);
  if (m.moe()) MT_TRY(validate_moe(m));
  MT_TRY(validate_attention_variants(m));
  if (m.norm == NormKind::layernorm && !m.bias)
    return make_error("model '{}': layernorm without bias is not supported; use \"norm\": \"rmsnorm\" or \"bias\": true",
                      m.name);
  if (!(m.norm_eps > 0)) return make_error("model '{}': norm_eps must be positive", m.name);
  return {};
}

std::string family_name(ModelFamily f) { return kFamilies.name(f); }
const EnumNames<Activation>& activation_names() { return kActivations; }

std::string describe_model(const ModelSpec& m) {
  const std::string image = fmt::format("{}x{}x{} images in {}x{} patches, {} classes", m.image_size, m.image_size,
                                        m.channels, m.patch, m.patch, m.classes);
  switch (m.family) {
    case ModelFamily::vit:
      return fmt::format("{}: vit, {} layers, hidden {}, heads {}, ffn {}, {} tokens; {}", m.name, m.layers, m.hidden,
                         m.heads, m.ffn, m.seq_len, image);
    case ModelFamily::swin:
      return fmt::format("{}: swin, stages of {} blocks with {} heads, width {} doubling per stage, window {}, {} "
                         "blocks with the mergings, {} tokens; {}",
                         m.name, fmt::join(m.depths, "-"), fmt::join(m.stage_heads, "-"), m.hidden, m.window,
                         m.layers, m.seq_len, image);
    case ModelFamily::vqa: return describe_vqa(m);
    case ModelFamily::decoder: break;
  }
  std::string text = fmt::format("{}: {} layers, hidden {}, heads {} (kv {}), ffn {}, vocab {}, seq {}", m.name,
                                 m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq_len);
  if (m.head_dim_size > 0) text += fmt::format(", head dim {}", m.head_dim_size);
  if (m.sliding_window > 0)
    text += m.window_pattern >= 2
                ? fmt::format(", sliding window {} (1 in {} layers global)", m.sliding_window, m.window_pattern)
                : fmt::format(", sliding window {} on every layer", m.sliding_window);
  if (m.attention_sinks) text += ", attention sinks";
  if (m.moe()) {
    text += fmt::format("; {} experts (top {}{}) on {} of the layers", m.experts, m.top_k,
                        m.renormalize ? ", renormalised" : "", m.moe_layer_count());
    if (m.shared_experts > 0) text += fmt::format(", {} shared", m.shared_experts);
    text += m.capacity_factor > 0 ? fmt::format(", capacity factor {:g}", m.capacity_factor) : ", dropless";
  }
  return text;
}

nlohmann::json model_to_json(const ModelSpec& m) {
  if (m.vqa()) return vqa_to_json(m);
  if (m.vision()) {
    nlohmann::json j = {{"name", m.name},       {"family", kFamilies.name(m.family)},
                        {"hidden", m.hidden},   {"ffn", m.ffn},
                        {"bias", m.bias},       {"norm", kNorms.name(m.norm)},
                        {"activation", kActivations.name(m.activation)},
                        {"norm_eps", m.norm_eps}, {"image_size", m.image_size},
                        {"patch", m.patch},     {"channels", m.channels},
                        {"classes", m.classes}};
    if (m.family == ModelFamily::vit) {
      j["layers"] = m.layers;
      j["heads"] = m.heads;
    } else {
      j["window"] = m.window;
      j["depths"] = m.depths;
      j["stage_heads"] = m.stage_heads;
    }
    return j;
  }
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
  // Only when they differ from the defaults, so that files and checkpoints
  // from before these fields read the same.
  if (m.head_dim_size > 0) j["head_dim"] = m.head_dim_size;
  if (m.sliding_window > 0) j["sliding_window"] = m.sliding_window;
  if (m.window_pattern > 0) j["window_pattern"] = m.window_pattern;
  if (m.attention_sinks) j["attention_sinks"] = true;
  if (m.moe()) {
    const ModelSpec d;
    j["experts"] = m.experts;
    j["top_k"] = m.top_k;
    if (m.shared_experts != d.shared_experts) j["shared_experts"] = m.shared_experts;
    if (m.moe_every != d.moe_every) j["moe_every"] = m.moe_every;
    if (m.dense_layers != d.dense_layers) j["dense_layers"] = m.dense_layers;
    if (m.dense_ffn != d.dense_ffn) j["dense_ffn"] = m.dense_ffn;
    if (m.renormalize != d.renormalize) j["renormalize"] = m.renormalize;
    if (m.capacity_factor != d.capacity_factor) j["capacity_factor"] = m.capacity_factor;
    if (m.aux_loss_coeff != d.aux_loss_coeff) j["aux_loss_coeff"] = m.aux_loss_coeff;
    if (m.z_loss_coeff != d.z_loss_coeff) j["z_loss_coeff"] = m.z_loss_coeff;
  }
  return j;
}

}  // namespace meshtrain
