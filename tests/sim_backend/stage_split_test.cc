// Uneven pipeline stages (models/parameters.h StageSplit): Megatron-Core's
// first/last stage layer counts, checked against counts written out by hand.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/plan/plan.h"
#include "models/parameters.h"

using namespace meshtrain;

namespace {

ModelSpec with_layers(int layers) {
  auto m = model_preset("llama3-405b");
  REQUIRE(m.ok());
  ModelSpec s = *m;
  s.layers = layers;
  return s;
}

}  // namespace

TEST_CASE("stage split: 0/0 is the even split place_layer always made", "[stage_split]") {
  const ModelSpec m = with_layers(24);
  for (int pp : {1, 2, 3, 4, 6})
    for (int vpp : {1, 2}) {
      if (24 % (pp * vpp) != 0) continue;
      const StageSplit s{pp, vpp, 0, 0};
      REQUIRE(check_stage_split(m, s).ok());
      const int per = 24 / (pp * vpp);
      for (int l = 0; l < 24; ++l) {
        const StagePlacement at = place_layer(m, l, s);
        CHECK(at.stage == (l / per) % pp);
        CHECK(at.chunk == (l / per) / pp);
      }
    }
}

TEST_CASE("stage split: Llama 3 405B, 126 layers on 16 stages with 7 on each end", "[stage_split]") {
  const ModelSpec m = with_layers(126);
  const StageSplit s{16, 1, 7, 7};
  REQUIRE(check_stage_split(m, s).ok());
  CHECK(stage_layer_count(m, s, 0) == 7);
  for (int st = 1; st < 15; ++st) CHECK(stage_layer_count(m, s, st) == 8);  // (126 - 14) / 14
  CHECK(stage_layer_count(m, s, 15) == 7);
  CHECK(virtual_stage_layers(m, s, 0).begin == 0);
  CHECK(virtual_stage_layers(m, s, 0).end == 7);
  CHECK(virtual_stage_layers(m, s, 1).begin == 7);
  CHECK(virtual_stage_layers(m, s, 1).end == 15);
  CHECK(virtual_stage_layers(m, s, 15).begin == 119);  // 7 + 14·8
  CHECK(virtual_stage_layers(m, s, 15).end == 126);
  CHECK(place_layer(m, 6, s).stage == 0);
  CHECK(place_layer(m, 7, s).stage == 1);
  CHECK(place_layer(m, 118, s).stage == 14);
  CHECK(place_layer(m, 119, s).stage == 15);
  CHECK(place_layer(m, -1, s).stage == 0);   // embeddings
  CHECK(place_layer(m, 126, s).stage == 15); // final norm and head

  // Every parameter on exactly one stage: the shards add up to the model.
  std::int64_t sum = 0;
  for (int st = 0; st < 16; ++st) sum += count_shard_parameters(m, 1, s, 1, st).total;
  CHECK(sum == count_parameters(m).total);  // untied embeddings: no copy
  // The end stages hold one layer fewer than a middle one, plus embedding or head.
  const ParamCount full = count_parameters(m);
  const std::int64_t per_layer = (full.total - full.embedding - m.hidden) / 126;  // less the final norm
  CHECK(count_shard_parameters(m, 1, s, 1, 1).total == 8 * per_layer);
  CHECK(count_shard_parameters(m, 1, s, 1, 0).total == 7 * per_layer + full.embedding / 2);
}

TEST_CASE("stage split: only one end given, with interleaved chunks", "[stage_split]") {
  const ModelSpec m = with_layers(34);
  // Stage 0 holds 4 layers (2 per chunk); stages 1-3 share 30: 10 each, 5 per chunk.
  const StageSplit s{4, 2, 4, 0};
  REQUIRE(check_stage_split(m, s).ok());
  CHECK(stage_layer_count(m, s, 0) == 4);
  CHECK(stage_layer_count(m, s, 3) == 10);
  // Virtual stages in order: (s0,c0) 2, (s1,c0) 5, (s2,c0) 5, (s3,c0) 5, (s0,c1) 2, ...
  CHECK(virtual_stage_layers(m, s, 4).begin == 17);
  CHECK(virtual_stage_layers(m, s, 4).end == 19);
  CHECK(place_layer(m, 17, s).stage == 0);
  CHECK(place_layer(m, 17, s).chunk == 1);
  CHECK(place_layer(m, 33, s).stage == 3);
  CHECK(place_layer(m, 33, s).chunk == 1);
  CHECK(virtual_stage_layers(m, s, 7).end == 34);
}

TEST_CASE("stage split: splits that do not divide name the numbers", "[stage_split]") {
  const ModelSpec m = with_layers(126);
  auto message = [&](StageSplit s) {
    const Status st = check_stage_split(m, s);
    REQUIRE_FALSE(st.ok());
    return st.error().message();
  };
  CHECK_THAT(message({16, 1, 0, 0}), Catch::Contains("126") && Catch::Contains("first_stage_layers"));
  CHECK_THAT(message({16, 1, 6, 7}), Catch::Contains("113") && Catch::Contains("14"));
  CHECK_THAT(message({1, 1, 7, 0}), Catch::Contains("pp >= 2"));
  CHECK_THAT(message({2, 1, 60, 60}), Catch::Contains("add up to 126"));
  CHECK_THAT(message({16, 2, 7, 7}), Catch::Contains("vpp 2"));
  CHECK_THAT(message({16, 1, -1, 7}), Catch::Contains(">= 0"));
}

TEST_CASE("stage split: plan fields from JSON, validated against the model", "[stage_split][plan]") {
  auto m = model_preset("llama3-405b");
  REQUIRE(m.ok());
  auto o = plan_overrides_from_json(
      nlohmann::json{{"tp", 8}, {"pp", 16}, {"dp", 2}, {"first_stage_layers", 7}, {"last_stage_layers", 7}});
  REQUIRE(o.ok());
  auto p = apply_overrides(Plan{}, *o);
  REQUIRE(p.ok());
  CHECK(p->stage_split().first_stage_layers == 7);
  CHECK(p->stage_split().last_stage_layers == 7);
  CHECK(validate_plan(*p, *m, 256).ok());
  CHECK(plan_to_json(*p)["first_stage_layers"] == 7);
  CHECK_FALSE(plan_to_json(Plan{}).contains("first_stage_layers"));  // old plans read the same
  // 126 layers do not split evenly over 16 stages without them.
  Plan even = *p;
  even.first_stage_layers = even.last_stage_layers = 0;
  const Status s = validate_plan(even, *m, 256);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("126") && Catch::Contains("first_stage_layers"));
}
