// Flexible interleaved layouts (models/parameters.h StageSplit): per-chunk
// layer counts and Megatron-Core's accounting of the embedding and the loss
// as layers, checked against counts written out by hand; the memory model's
// schedule walk against the even-chunk formula it replaces.
#include <catch2/catch.hpp>

#include <numeric>

#include <nlohmann/json.hpp>

#include "engine/memory/memory_model.h"
#include "engine/plan/plan.h"
#include "models/parameters.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;

namespace {

ModelSpec llama405b() { return testing::preset("llama3-405b"); }

StageSplit accounted(int pp, int vpp, bool embedding, bool loss) {
  StageSplit s{pp, vpp};
  s.embedding_in_split = embedding, s.loss_in_split = loss;
  return s;
}

}  // namespace

TEST_CASE("flexible layout: Llama 3 405B's embedding-only first chunk and loss-only last chunk",
          "[stage_split][flexible]") {
  const ModelSpec m = llama405b();  // 126 layers
  // 126 + 2 = 128 units over 16 stages of 8 chunks: one each, so the ends hold no body layer.
  const StageSplit s = accounted(16, 8, true, true);
  REQUIRE(check_stage_split(m, s).ok());
  const std::vector<int> counts = virtual_stage_layer_counts(m, s);
  REQUIRE(counts.size() == 128);
  CHECK(counts.front() == 0);
  CHECK(counts.back() == 0);
  CHECK(std::count(counts.begin(), counts.end(), 1) == 126);
  CHECK(stage_layer_count(m, s, 0) == 7);   // chunk 0 holds the embedding only
  CHECK(stage_layer_count(m, s, 15) == 7);  // chunk 7 holds the head only
  CHECK(stage_layer_count(m, s, 5) == 8);
  CHECK(place_layer(m, -1, s).stage == 0);
  CHECK(place_layer(m, -1, s).chunk == 0);
  CHECK(place_layer(m, 0, s).stage == 1);  // the first body layer is virtual stage 1
  CHECK(place_layer(m, 125, s).stage == 14);
  CHECK(place_layer(m, 125, s).chunk == 7);
  CHECK(place_layer(m, 126, s).stage == 15);
  CHECK(place_layer(m, 126, s).chunk == 7);
  // Without interleaving the same accounting is Megatron-Core's 7 + 14·8 + 7.
  const StageSplit flat = accounted(16, 1, true, true);
  REQUIRE(check_stage_split(m, flat).ok());
  const StageSplit given{16, 1, 7, 7};
  for (int st = 0; st < 16; ++st) CHECK(stage_layer_count(m, flat, st) == stage_layer_count(m, given, st));
  // Only the embedding counted: 127 does not divide by 16.
  const Status odd = check_stage_split(m, accounted(16, 1, true, false));
  REQUIRE_FALSE(odd.ok());
  CHECK_THAT(odd.error().message(), Catch::Contains("127") && Catch::Contains("16"));
}

TEST_CASE("flexible layout: chunk_layers give every virtual stage's layers", "[stage_split][flexible]") {
  ModelSpec m = llama405b();
  m.layers = 10;
  StageSplit s{2, 2};
  s.chunk_layers = {1, 4, 4, 1};  // (s0,c0) (s1,c0) (s0,c1) (s1,c1)
  REQUIRE(check_stage_split(m, s).ok());
  CHECK(stage_layer_count(m, s, 0) == 5);
  CHECK(virtual_stage_layers(m, s, 2).begin == 5);
  CHECK(virtual_stage_layers(m, s, 2).end == 9);
  CHECK(place_layer(m, 9, s).stage == 1);
  CHECK(place_layer(m, 9, s).chunk == 1);
  auto message = [&](std::vector<int> counts) {
    StageSplit bad = s;
    bad.chunk_layers = std::move(counts);
    const Status st = check_stage_split(m, bad);
    REQUIRE_FALSE(st.ok());
    return st.error().message();
  };
  CHECK_THAT(message({1, 4, 5}), Catch::Contains("3 entries") && Catch::Contains("4 virtual stages"));
  CHECK_THAT(message({1, 4, 4, 2}), Catch::Contains("add up to 11") && Catch::Contains("has 10"));
  CHECK_THAT(message({1, 0, 8, 1}), Catch::Contains("chunk_layers[1] is 0"));
  StageSplit both = s;
  both.first_stage_layers = 5;
  CHECK_THAT(check_stage_split(m, both).error().message(), Catch::Contains("give one of them"));
}

TEST_CASE("flexible layout: plan fields from JSON and flags' names", "[stage_split][flexible][plan]") {
  const ModelSpec m = llama405b();
  auto o = plan_overrides_from_json(nlohmann::json{{"tp", 8},
                                                   {"pp", 16},
                                                   {"vpp", 8},
                                                   {"schedule", "interleaved"},
                                                   {"global_batch", 16},
                                                   {"account_for_embedding_in_pipeline_split", true},
                                                   {"account_for_loss_in_pipeline_split", true}});
  REQUIRE(o.ok());
  auto p = apply_overrides(Plan{}, *o);
  REQUIRE(p.ok());
  CHECK(validate_plan(*p, m, 128).ok());
  CHECK(plan_to_json(*p)["account_for_loss_in_pipeline_split"] == true);
  auto listed = plan_overrides_from_json(nlohmann::json{{"chunk_layers", {1, 2, -3}}});
  REQUIRE_FALSE(listed.ok());
  CHECK_THAT(listed.error().message(), Catch::Contains("chunk_layers"));
}

TEST_CASE("flexible layout: the memory model walks the schedule over uneven chunks", "[stage_split][flexible][memory]") {
  Plan p;
  p.pp = 4, p.vpp = 2, p.schedule = ScheduleKind::interleaved, p.micro_batch = 1, p.global_batch = 8;
  // Equal chunks: the walk is the even formula, in-flight chunks × a chunk's bytes.
  for (int stage = 0; stage < 4; ++stage)
    CHECK(peak_activation_bytes(p, stage, {1.0, 1.0}) == inflight_microbatches(p, stage));
  // Uneven chunks: stage 0 warms up with (4-0-1)·2 + (2-1)·4 = 10 forwards: chunk 0 for micro-batches 0-3,
  // chunk 1 for 0-3, chunk 0 for 4-5; the 11th (chunk 0, micro-batch 6) comes before the first backward.
  CHECK(peak_activation_bytes(p, 0, {1.0, 10.0}) == Approx(7 * 1.0 + 4 * 10.0));
  // 1F1B holds min(p - stage, m) micro-batches of its one chunk.
  Plan flat = p;
  flat.vpp = 1, flat.schedule = ScheduleKind::one_f_one_b;
  CHECK(peak_activation_bytes(flat, 1, {2.0}) == Approx(3 * 2.0));
}
