// Overlap and prefetch change when ops run, never what they compute: ZeRO-3's
// prefetch across chunk boundaries and the optimizer update off the critical
// path (Plan::prefetch_across_chunks, Plan::overlap_update) give the bits of
// the plan without them, and the single-rank run's values.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

TEST_CASE("ZeRO-3 prefetch across chunks gives the bits of the prefetch within a pass", "[parallel][overlap][zero3]") {
  for (const Plan& base : {make_plan(1, 2, 2, 3, ScheduleKind::interleaved, 2),
                           make_plan(2, 2, 2, 3, ScheduleKind::one_f_one_b),
                           make_plan(1, 2, 2, 3, ScheduleKind::gpipe), make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b)}) {
    Plan within = base;
    within.prefetch_across_chunks = false;
    INFO("seed " << kSeed << ", plan " << describe(base));
    REQUIRE(base.prefetch_across_chunks);  // the default
    check_same_bits(run_plan(tiny_gpt(), base), run_plan(tiny_gpt(), within));
  }
  // And the single-rank values, with the tied embedding's unit used at both ends of one chunk.
  check_matches_reference(tiny_gpt(), make_plan(1, 2, 2, 3, ScheduleKind::interleaved, 2));
  check_matches_reference(tiny_gpt(), make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b));
}

TEST_CASE("optimizer updates off the critical path give the bits of the plan without", "[parallel][overlap]") {
  std::vector<Plan> plans;
  for (int zero : {0, 1, 2, 3}) plans.push_back(make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b));
  plans.push_back(make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2));
  plans.push_back(make_plan(1, 2, 2, 3, ScheduleKind::interleaved, 2));
  plans.push_back(make_plan(1, 2, 2, 2, ScheduleKind::gpipe));
  plans.push_back(make_plan(1, 2, 2, 1, ScheduleKind::zb_h1));
  Plan after = make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b);
  after.grad_sync = GradSync::after_backward;
  plans.push_back(after);
  Plan once = make_plan(1, 1, 2, 2, ScheduleKind::one_f_one_b);
  once.zero_reduce_once = true;
  plans.push_back(once);
  // Clipping on: the updates wait for the global norm; off: each bucket updates as it is reduced.
  for (const float clip : {0.5f, 0.f}) {
    StepOptions options = step_options();
    options.optimizer.max_grad_norm = clip;
    for (const Plan& base : plans) {
      Plan overlapped = base;
      overlapped.overlap_update = true;
      INFO("seed " << kSeed << ", plan " << describe(base) << ", clip " << clip);
      check_same_bits(run_plan(tiny_gpt(), overlapped, 0, options), run_plan(tiny_gpt(), base, 0, options));
    }
  }
  Plan hybrid = make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2);
  hybrid.overlap_update = true;
  check_matches_reference(tiny_gpt(), hybrid);
}

TEST_CASE("overlapped updates in a plan made of segments give the bits of the plan without",
          "[parallel][overlap][segments]") {
  // Each segment reduces and updates on its own data-parallel stream; the sums over segments and the
  // clip coefficient every segment's update waits for cross to and from the main stream.
  const ModelSpec m = tiny_llama();
  const char* disjoint = R"([
      {"blocks": [0, 2], "dp": 2, "ranks": [0, 1]},
      {"blocks": [3, 5], "pp": 2, "dp": 2, "microbatches": 2, "ranks": [2, 5], "zero": 1}])";
  const char* same_ranks = R"([
      {"blocks": [0, 2], "dp": 2, "zero": 2},
      {"blocks": [3, 5], "tp": 2}])";
  for (const float clip : {0.5f, 0.f}) {
    StepOptions options = step_options();
    options.optimizer.max_grad_norm = clip;
    for (const char* segments : {disjoint, same_ranks}) {
      Plan overlapped = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
      overlapped.overlap_update = true;
      const Plan p = segmented(m, overlapped, segments);
      for (const Plan& s : p.segments) REQUIRE(s.overlap_update);
      INFO("seed " << kSeed << ", plan " << describe(p) << ", clip " << clip);
      check_same_bits(run_plan(m, p, 0, options), run_plan(m, segmented(m, segments), 0, options));
    }
  }
  // And the single-rank values.
  Plan overlapped = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  overlapped.overlap_update = true;
  check_matches_reference(m, segmented(m, overlapped, disjoint));
}

TEST_CASE("the overlap fields round-trip through a plan file", "[parallel][overlap]") {
  Plan p = make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b);
  p.overlap_update = true;
  p.prefetch_across_chunks = false;
  const nlohmann::json j = plan_to_json(p);
  CHECK(j.at("overlap_update") == true);
  CHECK(j.at("prefetch_across_chunks") == false);
  // A plan file with the two fields as plan_to_json writes them.
  auto o = plan_overrides_from_json(
      nlohmann::json{{"overlap_update", j.at("overlap_update")}, {"prefetch_across_chunks", j.at("prefetch_across_chunks")}});
  INFO((o.ok() ? std::string() : o.error().message()));
  REQUIRE(o.ok());
  auto back = apply_overrides(Plan{}, o.value());
  REQUIRE(back.ok());
  CHECK(back.value().overlap_update);
  CHECK(!back.value().prefetch_across_chunks);
}
