// The VQA model: parameter counts and FLOPs against counts derived here from
// its modules' layer lists (independently of the block code), its modules,
// its spec's JSON form, the index maps of the joiner and the head, and
// gradients against finite differences of the loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "models/parameters.h"
#include "models/vqa_blocks.h"
#include "models/vqa_spec.h"
#include "tests/models/image_model_fixture.h"

using namespace meshtrain;

namespace {

// One pre-norm transformer layer of width C, MLP width F, `kv` key/value
// heads per query head: norms (LayerNorm weight and bias, or RMSNorm
// weight), QKV, output, MLP (GELU: up and down; SwiGLU: gate, up and down),
// with or without biases.
double layer_parameters(double C, double F, double kv, bool layernorm, bool swiglu, bool bias) {
  const double norms = 2 * (layernorm ? 2 * C : C);
  const double attention = (2 + 2 * kv) * C * C + (bias ? (2 + 2 * kv) * C : 0);
  const double mlp = (swiglu ? 3 : 2) * C * F + (bias ? (swiglu ? 2 * F : F) + C : 0);
  return norms + attention + mlp;
}

// LLaVA's modules: a ViT (patch projection with bias, class token,
// positions, layers), the projector (one or two linear layers with biases),
// the decoder (token embedding, learned positions or none, layers, final
// norm, untied head).
double vqa_parameters(const ModelSpec& m) {
  const VisionEncoderSpec& v = m.vision_encoder;
  const bool layernorm = m.norm == NormKind::layernorm;
  const double grid = m.image_size / m.patch, Cv = v.hidden, C = m.hidden, V = m.vocab;
  const double kv = static_cast<double>(m.kv_heads) / m.heads;
  const bool glu_v = v.activation == Activation::swiglu, glu = m.activation == Activation::swiglu;
  const double vision = (m.patch * m.patch * m.channels * Cv + Cv) + Cv + (1 + grid * grid) * Cv +
                        v.layers * layer_parameters(Cv, v.ffn, 1, layernorm, glu_v, v.bias);
  const double projector = Cv * C + C + (m.projector == ProjectorKind::mlp ? C * C + C : 0);
  const double positions = m.position == PositionKind::learned ? (grid * grid + m.question_len) * C : 0;
  const double language = V * C + positions +
                          m.decoder_layers * layer_parameters(C, m.ffn, kv, layernorm, glu, m.bias) +
                          (layernorm ? 2 * C : C) + C * V;
  return vision + projector + language;
}

ModelSpec preset(const std::string& name) { return *model_preset(name); }

// vqa-tiny with LLaVA-1.5's choices: an MLP projector, RMSNorm, SwiGLU, RoPE
// and no biases in the decoder, grouped-query attention.
ModelSpec tiny_llava() {
  ModelSpec m = preset("vqa-tiny");
  m.name = "vqa-tiny-llava";
  m.projector = ProjectorKind::mlp;
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.bias = false;
  m.kv_heads = 2;
  return m;
}

}  // namespace

TEST_CASE("VQA parameter counts match an independent count and LLaVA-1.5-13B", "[vqa]") {
  for (const ModelSpec& m : {preset("vqa-tiny"), preset("vqa-fmnist"), preset("llava-1.5-13b"), tiny_llava()}) {
    INFO(m.name);
    CHECK(count_parameters(m).total == static_cast<std::int64_t>(vqa_parameters(m)));
  }
  // The released llava-v1.5-13b: Vicuna-13B v1.5 (13,015,864,320), CLIP
  // ViT-L/14-336's vision tower (303,507,456) and the projector (31,467,520).
  // Ours counts CLIP's LayerNorms as RMSNorms (24·2 + 2 norms of 1024 biases
  // fewer; CLIP's pre- and post-layernorm weights are not there, the patch
  // projection's 1024 biases are): 52,224 parameters fewer.
  CHECK(count_parameters(preset("llava-1.5-13b")).total == 13'350'839'296 - 52'224);
}

TEST_CASE("VQA FLOPs per sample follow an independent count of GEMMs and attention", "[vqa][flops]") {
  for (const ModelSpec& m : {preset("vqa-tiny"), tiny_llava(), preset("llava-1.5-13b")}) {
    INFO(m.name);
    const VisionEncoderSpec& v = m.vision_encoder;
    const double P = vqa_image_tokens(m), Tv = P + 1, T = m.seq_len, Cv = v.hidden, C = m.hidden;
    const double glu_v = v.activation == Activation::swiglu ? 3 : 2, glu = m.activation == Activation::swiglu ? 3 : 2;
    const double kv = static_cast<double>(m.kv_heads) / m.heads;
    const double patch = 2 * P * m.patch * m.patch * m.channels * Cv;
    const double encoder = v.layers * (2 * Tv * (4 * Cv * Cv + glu_v * Cv * v.ffn) + 4 * Tv * Tv * Cv);
    const double projector = 2 * P * Cv * C + (m.projector == ProjectorKind::mlp ? 2 * P * C * C : 0);
    const double decoder =
        m.decoder_layers * (2 * T * ((2 + 2 * kv) * C * C + glu * C * m.ffn) + 4 * T * T * C);
    const double head = 2 * C * m.vocab;  // the answer row only
    const ForwardFlops f = forward_flops(m, 1, m.seq_len);
    CHECK(f.total() == Approx(patch + encoder + projector + decoder + head).epsilon(1e-12));
    CHECK(f.head == Approx(head));
  }
}

TEST_CASE("a VQA model's blocks name their modules: vision, projector, language", "[vqa]") {
  const ModelSpec m = preset("vqa-tiny");  // 2 encoder and 3 decoder layers
  const ModelBlocks blocks = model_blocks(m);
  // Blocks: patch embedding, vision layers 0-1 | projector | joiner, decoder layers 0-2, head.
  const std::vector<std::string> expected = {"vision",   "vision",   "vision",   "projector", "language",
                                             "language", "language", "language", "language"};
  REQUIRE(blocks.size() == expected.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    INFO("block " << i);
    CHECK(blocks[i]->module() == expected[i]);
    CHECK(blocks[i]->layer() == static_cast<int>(i) - 1);  // hook indices -1 .. L
    // Every parameter's name starts with its block's module.
    for (const ParamInfo& p : blocks[i]->parameters()) {
      INFO(p.name);
      CHECK(p.name.starts_with(expected[i] + "."));
    }
  }
  CHECK(blocks.back()->layer() == m.layers);
}

TEST_CASE("a VQA model file reads back as written and refuses what the family derives", "[vqa]") {
  for (const std::string name : {"vqa-tiny", "llava-1.5-13b"}) {
    INFO(name);
    const ModelSpec m = preset(name);
    auto back = model_from_json(model_to_json(m));
    REQUIRE(back.ok());
    CHECK(back->vision_encoder == m.vision_encoder);
    CHECK(back->projector == m.projector);
    CHECK(back->layers == m.layers);
    CHECK(back->seq_len == m.seq_len);
    CHECK(count_parameters(*back).total == count_parameters(m).total);
  }
  nlohmann::json j = model_to_json(preset("vqa-tiny"));
  auto error_of = [](const nlohmann::json& spec) {
    auto r = model_from_json(spec);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  nlohmann::json bad = j;
  bad["layers"] = 4;
  CHECK_THAT(error_of(bad), Catch::Contains("'layers' does not apply to a vqa model"));
  bad = j;
  bad["tied_embeddings"] = true;
  CHECK_THAT(error_of(bad), Catch::Contains("tied_embeddings"));
  bad = j;
  bad["vision"]["widht"] = 3;
  CHECK_THAT(error_of(bad), Catch::Contains("did you mean 'width'") || Catch::Contains("unknown vision encoder field"));
  bad = j;
  bad["projector"] = "conv";
  CHECK_THAT(error_of(bad), Catch::Contains("unknown projector 'conv'"));
  bad = j;
  bad["vision"]["heads"] = 3;
  CHECK_THAT(error_of(bad), Catch::Contains("vision.hidden 32 is not divisible by vision.heads 3"));
  bad = j;
  bad.erase("question_len");
  CHECK_THAT(error_of(bad), Catch::Contains("question_len"));
  nlohmann::json gpt = model_to_json(preset("tiny"));
  gpt["vision"] = j["vision"];
  CHECK_THAT(error_of(gpt), Catch::Contains("only a vqa model has a vision encoder"));
}

TEST_CASE("the joiner's and the head's index maps put the image before the question and read its last row",
          "[vqa]") {
  const int B = 3, P = 4, Q = 2, T = P + Q;
  const std::vector<std::int32_t> order = joined_order(B, P, Q);
  CHECK(std::set<std::int32_t>(order.begin(), order.end()).size() == order.size());  // a permutation
  CHECK(*std::max_element(order.begin(), order.end()) == B * T - 1);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < P; ++t) CHECK(order[static_cast<std::size_t>(b * T + t)] == b * P + t);
    for (int t = 0; t < Q; ++t) CHECK(order[static_cast<std::size_t>(b * T + P + t)] == B * P + b * Q + t);
  }
  CHECK(answer_rows(B, T) == std::vector<std::int32_t>{5, 11, 17});
}

namespace {

using VqaFixture = testing::ImageModelFixture;

}  // namespace

TEST_CASE("the VQA model's loss at initialisation is close to ln(vocab)", "[vqa]") {
  VqaFixture f(preset("vqa-tiny"), 1, 8);
  CHECK(f.loss() == Approx(std::log(48.0)).margin(0.1));
}

TEST_CASE("VQA gradients match finite differences of the loss", "[vqa]") {
  testing::check_image_model_gradient(preset("vqa-tiny"), 5, 3);
  // An MLP projector, RMSNorm, SwiGLU, RoPE (no position table) and grouped-query attention.
  testing::check_image_model_gradient(tiny_llava(), 5, 3);
}

TEST_CASE("full recomputation of the VQA blocks gives the same gradient bits", "[vqa]") {
  const ModelSpec m = tiny_llava();
  VqaFixture plain(m, 3, 4), recompute(m, 3, 4, ChunkOptions{Recompute::full, 0.f});
  CHECK(recompute.gradient() == plain.gradient());
}
