// Sliding-window attention, its layer pattern, and attention sinks in the
// model: the file fields, the parameters, the FLOPs of a windowed layer,
// and the whole model's gradient (the simulator's cost: tests/simulator/cost_model_test.cc).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "models/flops.h"
#include "models/parameters.h"
#include "tests/models/directional_derivatives.h"

using namespace meshtrain;

namespace {

ModelSpec tiny_windowed(int window, int pattern, bool sinks) {
  ModelSpec m = *model_preset("tiny");
  m.name = "tiny-windowed";
  m.layers = 2;
  m.seq_len = 16;
  m.kv_heads = 2;  // grouped-query: 4 query heads share 2 kv heads
  m.position = PositionKind::rope;
  m.sliding_window = window;
  m.window_pattern = pattern;
  m.attention_sinks = sinks;
  return m;
}

Status parse_error(nlohmann::json j) {
  auto m = model_from_json(j);
  return m.ok() ? ok_status() : Status(m.error());
}

}  // namespace

TEST_CASE("model files read sliding_window, window_pattern and attention_sinks", "[model][attention-variants]") {
  const nlohmann::json base = {{"layers", 6}, {"hidden", 64}, {"heads", 4}, {"kv_heads", 2}, {"vocab", 256},
                               {"seq_len", 64}};
  nlohmann::json j = base;
  j["sliding_window"] = 16, j["window_pattern"] = 2, j["attention_sinks"] = true;
  const ModelSpec m = *model_from_json(j);
  CHECK(m.sliding_window == 16);
  CHECK(m.attention_sinks);
  // Gemma 2 / gpt-oss: local and global alternate, layer 0 local.
  CHECK(std::vector<int>{m.layer_window(0), m.layer_window(1), m.layer_window(2), m.layer_window(5)} ==
        std::vector<int>{16, 0, 16, 0});
  // Gemma 3: five local layers to one global.
  ModelSpec g3 = m;
  g3.window_pattern = 6;
  for (int l = 0; l < 12; ++l) CHECK(g3.layer_window(l) == (l == 5 || l == 11 ? 0 : 16));
  // Mistral: every layer local.
  g3.window_pattern = 0;
  for (int l = 0; l < 6; ++l) CHECK(g3.layer_window(l) == 16);
  // The fields survive a round trip, and a model without them writes none.
  CHECK(model_to_json(*model_from_json(model_to_json(m))) == model_to_json(m));
  CHECK_FALSE(model_to_json(*model_from_json(base)).contains("sliding_window"));
  CHECK_THAT(describe_model(m), Catch::Contains("sliding window 16") && Catch::Contains("attention sinks"));

  auto refused = [&](nlohmann::json bad, const char* words) {
    const Status s = parse_error(bad);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains(words));
  };
  nlohmann::json bad = base;
  bad["window_pattern"] = 2;
  refused(bad, "without sliding_window");
  bad["sliding_window"] = 8, bad["window_pattern"] = 1;
  refused(bad, "window_pattern must be 0");
  bad = base, bad["sliding_window"] = -1;
  refused(bad, "sliding_window");
  refused({{"family", "vit"}, {"layers", 2}, {"hidden", 64}, {"heads", 4}, {"image_size", 28}, {"patch", 7},
           {"channels", 1}, {"classes", 10}, {"sliding_window", 4}},
          "decoder option");
}

TEST_CASE("attention sinks add one logit per head and layer, split with the heads", "[model][attention-variants]") {
  const ModelSpec plain = tiny_windowed(0, 0, false), sinks = tiny_windowed(0, 0, true);
  CHECK(count_parameters(sinks).total - count_parameters(plain).total == sinks.layers * sinks.heads);
  for (const ParamInfo& p : parameter_table(sinks))
    if (p.name.ends_with("attn.sinks")) {
      CHECK(p.shape == std::vector<std::int64_t>{sinks.heads});
      CHECK(p.split == TpSplit::column);
      CHECK_FALSE(p.weight_decay);
    }
}

TEST_CASE("a windowed layer's attention FLOPs count only the window", "[flops][attention-variants]") {
  // seq 4096, window 1024, half the layers local: each query of a local layer
  // reads 1024 keys instead of 4096 (Megatron's convention counts every key a
  // query may read, here the window's), so the attention FLOPs of a local
  // layer are a quarter of a global one's: 4·B·s·W·h per layer.
  ModelSpec full = *model_preset("llama2-7b");
  full.seq_len = 4096;
  ModelSpec windowed = full;
  windowed.sliding_window = 1024, windowed.window_pattern = 2;
  const double B = 2, s = 4096, h = full.hidden;
  const ForwardFlops f = forward_flops(full, B, 4096), w = forward_flops(windowed, B, 4096);
  const double global_layer = 4 * B * s * s * h, local_layer = 4 * B * s * 1024 * h;
  CHECK(f.attention == Approx(full.layers * global_layer));
  CHECK(w.attention == Approx(full.layers / 2 * (global_layer + local_layer)));
  CHECK(f.layers - w.layers == Approx(full.layers / 2 * (global_layer - local_layer)));
}

TEST_CASE("sliding-window and sink gradients of the whole model match finite differences",
          "[model][attention-variants]") {
  for (const ModelSpec& spec : {tiny_windowed(5, 2, true), tiny_windowed(3, 0, false)}) {
    INFO("window " << spec.sliding_window << ", pattern " << spec.window_pattern << ", sinks "
                   << spec.attention_sinks);
    testing::TokenModel f(spec, 11, 2, 16);
    // The sinks' gradient is small at initialisation: cap the step inside the softmax's curvature.
    testing::DirectionalCheck check;
    check.cap_element_step = true;
    testing::check_directional_derivatives(f.b, f.chunk.parameters(), f.gradient(), [&] { return f.loss(); }, check);
  }
  // The window changes the loss: the same weights read fewer keys.
  testing::TokenModel local(tiny_windowed(3, 0, false), 11, 2, 16), global(tiny_windowed(0, 0, false), 11, 2, 16);
  CHECK(local.loss() != global.loss());
}
