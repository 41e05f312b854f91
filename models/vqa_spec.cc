#include "models/vqa_spec.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>

#include "core/json_input.h"
#include "core/names.h"

namespace meshtrain {

int vqa_image_tokens(const ModelSpec& m) { return m.patch_grid() * m.patch_grid(); }

ModelSpec vision_encoder_model(const ModelSpec& m) {
  const VisionEncoderSpec& v = m.vision_encoder;
  ModelSpec e;
  e.name = m.name + ".vision";
  e.family = ModelFamily::vit;
  e.layers = v.layers;
  e.hidden = v.hidden;
  e.heads = e.kv_heads = v.heads;
  e.ffn = v.ffn;
  e.activation = v.activation;
  e.bias = v.bias;
  e.norm = m.norm;
  e.norm_eps = m.norm_eps;
  e.tied_embeddings = false;
  e.image_size = m.image_size, e.patch = m.patch, e.channels = m.channels;
  derive_model_fields(e);  // seq_len: the class token and the patches
  return e;
}

void derive_vqa_fields(ModelSpec& m) {
  m.layers = m.vision_encoder.layers + 2 + m.decoder_layers;
  m.seq_len = vqa_image_tokens(m) + m.question_len;
}

std::vector<ModelSpec> vqa_presets() {
  std::vector<ModelSpec> out;
  // Fashion-MNIST grids (engine/data/vqa_questions.h): 56×56 grey images of 2×2
  // garments, questions of at most 7 words, a vocabulary of under 48 words.
  auto fmnist = [](std::string name, int patch, VisionEncoderSpec vision, int layers, int hidden, int heads,
                   int ffn, int vocab) {
    ModelSpec m;
    m.name = std::move(name);
    m.family = ModelFamily::vqa;
    m.image_size = 56, m.patch = patch, m.channels = 1;
    m.vision_encoder = vision;
    m.decoder_layers = layers;
    m.hidden = hidden;
    m.heads = m.kv_heads = heads;
    m.ffn = ffn;
    m.vocab = vocab;
    m.question_len = 7;
    m.tied_embeddings = false;
    return m;
  };
  // Tests: 14×14 patches (4 per garment, 16 image tokens), two encoder and
  // three decoder layers (a pipeline boundary fits inside either module, and
  // the language module's body, the joiner and three layers, splits over pp
  // 2 or 4), 4 heads (tp 2 or 4).
  out.push_back(fmnist("vqa-tiny", 14, {2, 32, 4, 64}, 3, 32, 4, 64, 48));
  // Trainable on a loaded 2-core CPU: twice as wide and one layer deeper per
  // module. Its patches are vqa-tiny's: with 7×7 patches (64 image tokens)
  // a step costs 3.5 times as much and reached 54.4% in 3000 steps where
  // these reached 59.9% in 4000 in half the time (experiments/RESULTS.md).
  out.push_back(fmnist("vqa-fmnist", 14, {3, 64, 4, 256}, 3, 64, 4, 256, 48));

  // LLaVA-1.5-13B (Liu et al. 2023, "Improved Baselines with Visual
  // Instruction Tuning", Sec. 3.1 and the released llava-v1.5-13b config):
  //  * vision: CLIP ViT-L/14 at 336² (openai/clip-vit-large-patch14-336
  //    config: hidden 1024, 24 layers, 16 heads, intermediate 4096, patch 14,
  //    RGB), 576 patch tokens + the class token. LLaVA reads layer 23's
  //    output (mm_vision_select_layer -2) and keeps the tower frozen; we run
  //    and train all 24 layers (frozen modules are not modelled). CLIP's
  //    quick-GELU is timed as GELU.
  //  * projector: mlp2x_gelu, 1024 -> 5120 -> 5120.
  //  * language: Vicuna-13B v1.5 = Llama 2 13B (its config.json: hidden 5120,
  //    40 layers, 40 heads, intermediate 13824, vocab 32000, RMSNorm eps 1e-5,
  //    RoPE theta 10000, SwiGLU, no biases, untied head).
  //  * question_len 64: a VQAv2-style question with LLaVA's system prompt
  //    and "Answer the question using a single word or phrase." (~60
  //    tokens), so the decoder reads 576 + 64 = 640 tokens.
  // One norm per model here: CLIP's LayerNorms are counted as RMSNorms, 52K
  // fewer bias parameters than the released tower (of 13.35B).
  ModelSpec llava;
  llava.name = "llava-1.5-13b";
  llava.family = ModelFamily::vqa;
  llava.image_size = 336, llava.patch = 14, llava.channels = 3;
  llava.vision_encoder = {24, 1024, 16, 4096, Activation::gelu, true};
  llava.projector = ProjectorKind::mlp;
  llava.decoder_layers = 40;
  llava.hidden = 5120;
  llava.heads = llava.kv_heads = 40;
  llava.ffn = 13824;
  llava.vocab = 32000;
  llava.question_len = 64;
  llava.tied_embeddings = false;
  llava.bias = false;
  llava.norm = NormKind::rmsnorm;
  llava.activation = Activation::swiglu;
  llava.position = PositionKind::rope;
  out.push_back(llava);
  for (ModelSpec& m : out) derive_vqa_fields(m);
  return out;
}

namespace {

const EnumNames<ProjectorKind> kProjectors{{{ProjectorKind::linear, "linear"}, {ProjectorKind::mlp, "mlp"}}};

Status read_vision(const nlohmann::json& j, VisionEncoderSpec& v) {
  MT_ASSIGN(const JsonFields f,
            JsonFields::of(j, "vision encoder field",
                           "model field 'vision' must be an object such as {\"layers\": 24, \"hidden\": 1024, "
                           "\"heads\": 16, \"ffn\": 4096}"));
  MT_TRY(f.check_known({"layers", "hidden", "heads", "ffn", "activation", "bias"}));
  const std::pair<const char*, int*> sizes[] = {{"layers", &v.layers}, {"hidden", &v.hidden}, {"heads", &v.heads},
                                                {"ffn", &v.ffn}};
  for (auto [key, out] : sizes) MT_TRY(f.get_int(key, model_field_range(key), *out));
  if (!f.has("ffn")) v.ffn = 4 * v.hidden;
  MT_TRY(f.get_bool("bias", v.bias));
  return f.get_choice("activation", activation_names(), v.activation);
}

}  // namespace

Status read_vqa_fields(const nlohmann::json& j, ModelSpec& m) {
  struct Refused {
    const char* field;
    const char* why;
  };
  static const Refused kRefused[] = {
      {"layers", "a VQA model's layers follow from vision.layers and decoder_layers"},
      {"seq_len", "a VQA model's tokens follow from image_size, patch and question_len"},
      {"classes", "a VQA model answers with a word of its vocab"},
      {"window", "the vision encoder is a ViT"},
      {"depths", "the vision encoder is a ViT; give vision.layers"},
      {"stage_heads", "the vision encoder is a ViT; give vision.heads"},
      {"experts", "a VQA model's decoder is dense"},
      {"top_k", "a VQA model's decoder is dense"},
      {"head_dim", "a VQA model's heads split its width evenly"},
  };
  for (const Refused& r : kRefused)
    if (j.contains(r.field))
      return make_error("model field '{}' does not apply to a vqa model ({}); remove it", r.field, r.why);
  MT_ASSIGN(const JsonFields f, JsonFields::of(j, "model field", "a vqa model must be a JSON object"));
  if (!f.has("vision"))
    return make_error("a vqa model needs \"vision\": {{\"layers\", \"hidden\", \"heads\", \"ffn\"}}, its encoder");
  MT_TRY(read_vision(f.at("vision"), m.vision_encoder));
  for (auto [key, out] : {std::pair{"decoder_layers", &m.decoder_layers}, {"question_len", &m.question_len}}) {
    if (!f.has(key)) return make_error("a vqa model needs the integer field '{}'", key);
    MT_TRY(f.get_int(key, model_field_range(key), *out));
  }
  return f.get_choice("projector", kProjectors, m.projector);
}

Status validate_vqa(const ModelSpec& m) {
  auto positive = [&](const std::string& what, int v) -> Status {
    if (v <= 0) return make_error("model '{}': {} must be positive, got {}", m.name, what, v);
    return {};
  };
  MT_TRY(validate_image_fields(m));
  const VisionEncoderSpec& v = m.vision_encoder;
  MT_TRY(positive("vision.layers", v.layers));
  MT_TRY(positive("vision.hidden", v.hidden));
  MT_TRY(positive("vision.heads", v.heads));
  MT_TRY(positive("vision.ffn", v.ffn));
  if (v.hidden % v.heads != 0)
    return make_error("model '{}': vision.hidden {} is not divisible by vision.heads {}", m.name, v.hidden, v.heads);
  MT_TRY(positive("decoder_layers", m.decoder_layers));
  MT_TRY(positive("question_len", m.question_len));
  MT_TRY(positive("vocab", m.vocab));
  if (m.tied_embeddings)
    return make_error("model '{}': a vqa model cannot tie its head to the question embedding (the embedding sits "
                      "after the vision encoder, on no pipeline end); set \"tied_embeddings\": false", m.name);
  if (m.classes != 0) return make_error("model '{}': a vqa model answers with words, classes must be 0", m.name);
  return ok_status();
}

std::string describe_vqa(const ModelSpec& m) {
  const VisionEncoderSpec& v = m.vision_encoder;
  return fmt::format("{}: vqa; vision {} layers, hidden {}, heads {}, ffn {} over {}x{}x{} images in {}x{} patches "
                     "({} image tokens); {} projector; language {} layers, hidden {}, heads {} (kv {}), ffn {}, "
                     "vocab {}, {} question tokens ({} tokens)",
                     m.name, v.layers, v.hidden, v.heads, v.ffn, m.image_size, m.image_size, m.channels, m.patch,
                     m.patch, vqa_image_tokens(m), kProjectors.name(m.projector), m.decoder_layers, m.hidden, m.heads,
                     m.kv_heads, m.ffn, m.vocab, m.question_len, m.seq_len);
}

nlohmann::json vqa_to_json(const ModelSpec& m) {
  const VisionEncoderSpec& v = m.vision_encoder;
  return {{"name", m.name},
          {"family", "vqa"},
          {"image_size", m.image_size},
          {"patch", m.patch},
          {"channels", m.channels},
          {"vision",
           {{"layers", v.layers},
            {"hidden", v.hidden},
            {"heads", v.heads},
            {"ffn", v.ffn},
            {"activation", activation_names().name(v.activation)},
            {"bias", v.bias}}},
          {"projector", kProjectors.name(m.projector)},
          {"decoder_layers", m.decoder_layers},
          {"hidden", m.hidden},
          {"heads", m.heads},
          {"kv_heads", m.kv_heads},
          {"ffn", m.ffn},
          {"vocab", m.vocab},
          {"question_len", m.question_len},
          {"tied_embeddings", false},
          {"bias", m.bias},
          {"norm", m.norm == NormKind::layernorm ? "layernorm" : "rmsnorm"},
          {"activation", activation_names().name(m.activation)},
          {"position", m.position == PositionKind::learned ? "learned" : "rope"},
          {"norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta}};
}

}  // namespace meshtrain
