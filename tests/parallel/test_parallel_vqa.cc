// The VQA model (a ViT encoder, a projector, a causal decoder) under every
// kind of parallelism of a uniform plan computes what the single-rank run
// computes (the same checks and tolerances as the other models' plans),
// ranks as threads. vqa-tiny has 7 body blocks: vision layers 0-1 (hook
// indices 0, 1), the projector (2), the question joiner (3) and decoder
// layers 0-2 (4-6).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/plan/segment_plan.h"
#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

ModelSpec vqa() { return *model_preset("vqa-tiny"); }

Plan sp(Plan p) {
  p.sequence_parallel = true;
  return p;
}

}  // namespace

TEST_CASE("VQA under tensor and sequence parallelism matches the single-rank run", "[parallel][vqa]") {
  check_matches_reference(vqa(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(vqa(), make_plan(4, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(vqa(), sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
}

TEST_CASE("VQA with a pipeline boundary inside the encoder, between modules or inside the decoder matches the "
          "single-rank run",
          "[parallel][vqa]") {
  // Stage 0: the patch embedding and vision layer 0; stage 1 the rest.
  check_matches_reference(vqa(), with_stage_layers(make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), 1, 0));
  // 3 + 4: the encoder and projector, then the language model.
  check_matches_reference(vqa(), with_stage_layers(make_plan(1, 2, 1, 0, ScheduleKind::gpipe), 3, 0));
  // Stage 1: decoder layers 1-2 and the head.
  check_matches_reference(vqa(), with_stage_layers(make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), 5, 0));
  // pp 4: the encoder, projector and joiner, then one decoder layer per stage.
  check_matches_reference(vqa(), with_stage_layers(make_plan(1, 4, 1, 0, ScheduleKind::one_f_one_b), 4, 0));
}

TEST_CASE("VQA under data parallelism, ZeRO and recomputation matches the single-rank run", "[parallel][vqa]") {
  for (int zero : {1, 3}) check_matches_reference(vqa(), make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b));
  Plan recompute = with_stage_layers(make_plan(2, 2, 1, 0, ScheduleKind::one_f_one_b), 1, 0);
  recompute.recompute = Recompute::full;
  check_matches_reference(vqa(), recompute);
  check_matches_reference(vqa(), sp(with_stage_layers(make_plan(2, 2, 2, 2, ScheduleKind::gpipe), 5, 0)));
}

TEST_CASE("a segment plan places the VQA modules by their names", "[parallel][vqa][segments]") {
  // Blocks: patch embedding and vision layers 0-1 (0-2), the projector (3),
  // the question joiner, decoder layers 0-2 and the answer head (4-8).
  const ModelSpec m = vqa();
  const Plan base = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  auto segments = segments_from_json(nlohmann::json::parse(R"([
      {"modules": ["vision", "projector"], "tp": 2},
      {"modules": ["language"], "ranks": [2, 3], "pp": 2}])"),
                                     m, base);
  REQUIRE(segments.ok());
  Plan p = base;
  p.segments = *segments;
  const std::string layout = describe_segments(p, m);
  INFO(layout);
  CHECK_THAT(layout, Catch::Contains("blocks 0-3 (vision, projector)") && Catch::Contains("blocks 4-8 (language)"));
  auto unknown = segments_from_json(nlohmann::json::parse(R"([{"modules": ["encoder"]}])"), m, base);
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.error().message(),
             Catch::Contains("vision") && Catch::Contains("projector") && Catch::Contains("language"));
}

TEST_CASE("a VQA vocabulary that tp does not divide matches the single-rank run", "[parallel][vqa][vocab]") {
  // 47 words: tp 2 pads the second shard by one column, tp 4 the last by one; the
  // padded columns must take no probability and get no gradient.
  ModelSpec m = vqa();
  m.name = "vqa-tiny-vocab47";  // the reference cache keys on the name
  m.vocab = 47;
  check_matches_reference(m, make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(m, make_plan(4, 1, 1, 0, ScheduleKind::one_f_one_b));
}
