// Flexible interleaved layouts against the single-rank run: chunks of
// different sizes, an embedding-only first chunk and a loss-only last chunk
// (Megatron-Core's accounting, and given as chunk_layers).
#include "tests/parallel/parallel_check.h"

namespace meshtrain::testing {
namespace {

Plan with_chunks(Plan p, std::vector<int> counts) {
  p.chunk_layers = std::move(counts);
  return p;
}

Plan accounting(Plan p) {
  p.embedding_in_split = p.loss_in_split = true;
  return p;
}

TEST_CASE("uneven interleaved chunks match the single-rank run", "[parallel][pp][flexible]") {
  // 6 layers over pp 2 · vpp 2 virtual stages as 1, 2, 2, 1 and with empty ends.
  check_matches_reference(tiny_gpt6(), with_chunks(make_plan(1, 2, 1, 0, ScheduleKind::interleaved, 2), {1, 2, 2, 1}));
  check_matches_reference(tiny_gpt6(), with_chunks(make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2), {0, 3, 3, 0}));
}

TEST_CASE("Megatron-Core's embedding and loss accounting matches the single-rank run", "[parallel][pp][flexible]") {
  // 6 + 2 units over pp 2 · vpp 4: the first chunk holds only the embedding, the last only the head and loss.
  check_matches_reference(tiny_gpt6(), accounting(make_plan(1, 2, 1, 0, ScheduleKind::interleaved, 4)));
  // Without interleaving: 8 units over 2 stages, 3 + 3 layers.
  check_matches_reference(tiny_gpt6(), accounting(make_plan(1, 2, 2, 3, ScheduleKind::one_f_one_b)));
}

}  // namespace
}  // namespace meshtrain::testing

namespace meshtrain::testing {
namespace {

TEST_CASE("ZB-H1 gives 1F1B's bits", "[parallel][pp][zb]") {
  // Every parameter's gradient sums the micro-batches in the same order, only later: the same bits.
  for (const Plan& base : {make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), make_plan(2, 2, 2, 1, ScheduleKind::one_f_one_b)}) {
    Plan zb = base;
    zb.schedule = ScheduleKind::zb_h1;
    INFO(describe(base));
    for (const ModelSpec& m : {tiny_gpt(), tiny_llama()}) {
      const PlanRun one = run_plan(m, base), split = run_plan(m, zb);
      CHECK(split.ranks[0].losses == one.ranks[0].losses);
      CHECK(split.ranks[0].grad_norms == one.ranks[0].grad_norms);
      CHECK(split.ranks[0].state == one.ranks[0].state);
    }
  }
  Plan sp = make_plan(2, 4, 1, 1, ScheduleKind::zb_h1);
  sp.sequence_parallel = true;
  check_matches_reference(tiny_gpt(), sp);
}

TEST_CASE("ZB-H1 with ZeRO 2 or 3 is refused naming the reason", "[parallel][zb][errors]") {
  const Status s = validate_plan(make_plan(1, 2, 2, 2, ScheduleKind::zb_h1), tiny_gpt());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("zb-h1") && Catch::Contains("--zero 0 or 1"));
}

}  // namespace
}  // namespace meshtrain::testing
