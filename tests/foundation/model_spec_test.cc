#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"
#include "models/parameters.h"
#include "tests/models/model_specs.h"
#include "tests/training/error_of.h"

using namespace meshtrain;
using testing::error_of;
using testing::preset;

TEST_CASE("GPT-2 124M has 124,439,808 parameters", "[model]") {
  // Tied embeddings, vocab 50257, 1024 learned positions (HF gpt2 num_parameters()).
  auto c = count_parameters(preset("gpt2-124m"));
  CHECK(c.total == 124'439'808);
  // Without embeddings: 12 · (12·768² + 13·768) + 2·768 (final norm).
  CHECK(c.non_embedding() == 12 * (12LL * 768 * 768 + 13 * 768) + 2 * 768);
}

TEST_CASE("Llama 2 7B has 6,738,415,616 parameters", "[model]") {
  CHECK(count_parameters(preset("llama2-7b")).total == 6'738'415'616LL);
}

TEST_CASE("GPT-3 175B has about 174.6e9 parameters", "[model]") {
  double n = static_cast<double>(count_parameters(preset("gpt3-175b")).total);
  CHECK(n == Approx(174.6e9).epsilon(0.001));
}

TEST_CASE("Llama 3 8B and 70B match their published sizes", "[model]") {
  // Meta's model cards: 8.03B and 70.6B.
  CHECK(static_cast<double>(count_parameters(preset("llama3-8b")).total) == Approx(8.03e9).epsilon(0.002));
  CHECK(static_cast<double>(count_parameters(preset("llama3-70b")).total) == Approx(70.55e9).epsilon(0.002));
}

TEST_CASE("Megatron presets carry Table 1 of Narayanan et al. 2021", "[model]") {
  struct Row {
    const char* name;
    int heads, hidden, layers;
    double billions;
  };
  // Table 1 lists the parameter count in billions for each configuration.
  for (Row r : {Row{"megatron-1.7b", 24, 2304, 24, 1.7}, Row{"megatron-3.6b", 32, 3072, 30, 3.6},
                Row{"megatron-7.5b", 32, 4096, 36, 7.5}, Row{"megatron-18.4b", 48, 6144, 40, 18.4},
                Row{"megatron-39.1b", 64, 8192, 48, 39.1}, Row{"megatron-76.1b", 80, 10240, 60, 76.1},
                Row{"megatron-145.6b", 96, 12288, 80, 145.6}, Row{"megatron-310.1b", 128, 16384, 96, 310.1},
                Row{"megatron-529.6b", 128, 20480, 105, 529.6}, Row{"megatron-1t", 160, 25600, 128, 1008.0}}) {
    INFO(r.name);
    ModelSpec m = preset(r.name);
    CHECK(m.heads == r.heads);
    CHECK(m.hidden == r.hidden);
    CHECK(m.layers == r.layers);
    CHECK(m.vocab == 51200);
    CHECK(m.seq_len == 2048);
    // The table rounds to one decimal (1.65B is printed as 1.7).
    CHECK(static_cast<double>(count_parameters(m).total) / 1e9 == Approx(r.billions).margin(0.05 + 1e-9));
  }
}

TEST_CASE("every preset validates", "[model]") {
  for (const auto& name : model_preset_names()) {
    INFO(name);
    CHECK(validate_model(preset(name)).ok());
  }
}

TEST_CASE("tiny divides by tp up to 4 and pp*vpp up to 4", "[model]") {
  ModelSpec m = preset("tiny");
  CHECK(m.layers == 4);
  CHECK(m.heads == 4);
  CHECK(m.hidden == 64);
  CHECK(m.vocab == 256);
  CHECK(m.seq_len == 64);
}

TEST_CASE("tensor-parallel shards split column, row and vocab weights", "[model]") {
  ModelSpec m = preset("gpt2-124m");
  // Per layer at tp=2: qkv 768·2304/2 + 2304/2, out 768·768/2 + 768, mlp up 768·3072/2 + 3072/2,
  // down 3072·768/2 + 768, two layernorms 4·768 (replicated).
  const std::int64_t layer = 768LL * 2304 / 2 + 2304 / 2 + 768LL * 768 / 2 + 768 + 768LL * 3072 / 2 + 3072 / 2 +
                             3072LL * 768 / 2 + 768 + 4 * 768;
  // Vocabulary padded to 50258 rows, 25129 per rank; positions replicated.
  const std::int64_t embedding = 25129LL * 768 + 1024LL * 768;
  auto s = count_shard_parameters(m, 2, 1, 1, 1, 0);
  CHECK(s.total == 12 * layer + embedding + 2 * 768);
  CHECK(s.embedding == embedding);
  // pp = 2: stage 1 gets layers 6..11, the final norm and a copy of the tied embedding.
  auto last = count_shard_parameters(m, 1, 2, 1, 1, 1);
  const std::int64_t full_layer = 12LL * 768 * 768 + 13 * 768;
  CHECK(last.total == 6 * full_layer + 2 * 768 + 50257LL * 768);
  auto first = count_shard_parameters(m, 1, 2, 1, 1, 0);
  CHECK(first.total == 6 * full_layer + 50257LL * 768 + 1024LL * 768);
}

TEST_CASE("the fused qkv weight is split per segment", "[model]") {
  ModelSpec m = preset("llama3-8b");
  auto table = parameter_table(m);
  const ParamInfo& qkv = table[1 + 1];  // embed, norm1, qkv
  REQUIRE(qkv.name == "layers.0.attn.qkv.weight");
  CHECK(qkv.shape == std::vector<std::int64_t>{4096, (32 + 16) * 128});
  CHECK(qkv.segments == std::vector<std::int64_t>{4096, 1024, 1024});
}

TEST_CASE("layers are placed on pipeline stages and chunks", "[model]") {
  ModelSpec m = preset("tiny");  // 4 layers
  // pp 2, vpp 2: virtual stages 0..3, one layer each; chunk c of stage s is virtual stage c·2 + s.
  CHECK(place_layer(m, 0, 2, 2).stage == 0);
  CHECK(place_layer(m, 1, 2, 2).stage == 1);
  CHECK(place_layer(m, 2, 2, 2).stage == 0);
  CHECK(place_layer(m, 2, 2, 2).chunk == 1);
  CHECK(place_layer(m, -1, 2, 2).stage == 0);
  CHECK(place_layer(m, 4, 2, 2).stage == 1);
  CHECK(place_layer(m, 4, 2, 2).chunk == 1);
}

TEST_CASE("model specs load from JSON with the preset field names", "[model]") {
  nlohmann::json j = {{"name", "mine"}, {"layers", 2},   {"hidden", 32}, {"heads", 4},
                      {"vocab", 100},   {"seq_len", 16}, {"norm", "rmsnorm"}};
  auto m = model_from_json(j);
  REQUIRE(m.ok());
  CHECK(m->ffn == 128);
  CHECK(m->kv_heads == 4);
  CHECK(m->norm == NormKind::rmsnorm);

  j["hiden"] = 3;
  auto bad = model_from_json(j);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("hiden") && Catch::Contains("did you mean 'hidden'"));

  nlohmann::json wrong_type = {{"layers", "two"}};
  CHECK_THAT(error_of(model_from_json(wrong_type)), Catch::Contains("'layers' must be an integer"));

  nlohmann::json indivisible = {{"layers", 2}, {"hidden", 30}, {"heads", 4}, {"vocab", 10}, {"seq_len", 8}};
  CHECK_THAT(error_of(model_from_json(indivisible)), Catch::Contains("hidden 30 is not divisible by heads 4"));
}

TEST_CASE("load_model reads files and suggests presets", "[model]") {
  const std::string path = "model_spec_test_model.json";
  std::ofstream(path) << R"({"layers": 3, "hidden": 48, "heads": 6, "vocab": 256, "seq_len": 32})";
  auto m = load_model(path);
  REQUIRE(m.ok());
  CHECK(m->layers == 3);
  std::remove(path.c_str());

  CHECK_THAT(error_of(load_model("gpt2-124M")), Catch::Contains("did you mean 'gpt2-124m'"));
  CHECK_THAT(error_of(load_model("/nonexistent/model.json")),
             Catch::Contains("model file '/nonexistent/model.json' does not exist"));
}

TEST_CASE("count_shard_parameters by runs of alike layers equals the sum over every tensor", "[model]") {
  // The oracle places each tensor with place_layer and sums its shard, as
  // the memory model did before it summed runs of alike layers.
  auto oracle = [](const ModelSpec& m, int tp, const StageSplit& split, int ep, int stage, int etp) {
    ShardCount c;
    const int head_stage = place_layer(m, m.layers, split).stage;
    for (const ParamInfo& p : parameter_table(m)) {
      if (!split.holds(m, p.layer)) continue;
      const std::int64_t n = shard_numel(m, p, tp, ep, etp);
      const bool embedding = p.split == TpSplit::vocab || p.name == "embed.positions";
      if (place_layer(m, p.layer, split).stage == stage) {
        c.total += n;
        if (embedding) c.embedding += n;
        if (p.expert) c.expert += n;
      }
      if (p.name == "embed.tokens" && m.tied_embeddings && split.head && split.pp > 1 && head_stage == stage)
        c.total += n, c.embedding += n;
    }
    return c;
  };
  int checked = 0;
  for (const std::string& name : model_preset_names()) {
    const ModelSpec m = preset(name);
    std::vector<StageSplit> splits{StageSplit{1, 1, 0, 0}, StageSplit{2, 1, 0, 0}, StageSplit{4, 1, 0, 0}};
    if (m.layers % 4 == 0) splits.push_back(StageSplit{2, 2, 0, 0});
    if (m.layers > 4) splits.push_back(StageSplit{2, 1, 1, 0});  // an uneven first stage
    StageSplit window{2, 1, 0, 0};
    window.first_layer = 1, window.layers = m.layers - 1, window.embedding = false;  // a segment's layers
    splits.push_back(window);
    for (const StageSplit& split : splits) {
      if (!check_stage_split(m, split).ok()) continue;
      const int ep = m.experts > 1 ? 2 : 1;
      for (int stage = 0; stage < split.pp; ++stage) {
        INFO(name << " pp " << split.pp << " vpp " << split.vpp << " first " << split.first_stage_layers
                  << " window " << split.first_layer << " stage " << stage);
        const ShardCount got = count_shard_parameters(m, 2, split, ep, stage);
        const ShardCount want = oracle(m, 2, split, ep, stage, 0);
        CHECK(got.total == want.total);
        CHECK(got.embedding == want.embedding);
        CHECK(got.expert == want.expert);
        ++checked;
      }
    }
  }
  CHECK(checked > 50);
}
