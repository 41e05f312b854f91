// The EP all-to-all overlap's schedule (engine/schedule/a2a_overlap.h):
// one warm-up forward more than Megatron's 1F1B and interleaved schedules,
// derived here by hand, and pairs that still communicate without deadlock.
#include "engine/schedule/a2a_overlap.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "engine/schedule/builders.h"
#include "engine/schedule/communication.h"
#include "engine/schedule/dry_run.h"
#include "engine/schedule/validate.h"
#include "tests/schedule/schedule_testing.h"

using namespace meshtrain;
using namespace meshtrain::schedule;

TEST_CASE("a2a overlap without pipelining: F0 runs alone, then each forward pairs with the previous backward",
          "[schedule][a2a_overlap]") {
  // Megatron's combined_1f1b_schedule_for_no_pipelining: forward 0, then (forward j+1, backward j), then the
  // last backward.
  const PairedSchedule s = pair_forward_backward(must(build_1f1b({1, 1, 4})));
  CHECK(format_schedule(s.compute) == "rank 0: F0 F1 B0 F2 B1 F3 B2 B3\n");
  using K = Action::Kind;
  CHECK(s.pairs == std::vector<Pair>{{{K::forward, 0, 0, 1}, {K::backward, 0, 0, 0}},
                                     {{K::forward, 0, 0, 2}, {K::backward, 0, 0, 1}},
                                     {{K::forward, 0, 0, 3}, {K::backward, 0, 0, 2}}});
  // One stage: no communication to move.
  const Schedule full = must(insert_communication(s.compute));
  CHECK(hoist_pair_communication(full, s.pairs) == full);
  // One micro-batch: F0 B0 depend on each other, no pair.
  CHECK(pair_forward_backward(must(build_1f1b({1, 1, 1}))).pairs.empty());
}

TEST_CASE("a2a overlap on interleaved p=2 v=2 m=4: one warm-up forward more per rank", "[schedule][a2a_overlap]") {
  // From the interleaved rows (schedule_test.cc): each backward that a forward directly follows trades places
  // with it, so rank 0 runs 6 forwards before its first backward (Megatron's warm-up (p-r-1)·2 + (v-1)·p = 4,
  // + 1 for the overlap, then the first steady forward) and rank 1 4.
  const PairedSchedule s = pair_forward_backward(must(build_interleaved_1f1b({2, 2, 4})));
  CHECK(format_schedule(s.compute) ==
        "rank 0: F0 F1 F0.1 F1.1 F2   F3 B0.1 F2.1 B1.1 F3.1 B0 B1   B2.1 B3.1 B2 B3\n"
        "rank 1: F0 F1 F0.1 F1.1 B0.1 F2 B1.1 F3   B0   F2.1 B1 F3.1 B2.1 B3.1 B2 B3\n");
  // The pair's backward gradient is received before its forward, and the forward's activation sent after
  // the backward: rank 0's pair (F3, B0.1) reads "RG0.1 F3 B0.1 SA3".
  const Schedule full = hoist_pair_communication(must(insert_communication(s.compute)), s.pairs);
  std::string rank0;
  for (const Action& a : full.ranks[0]) rank0 += format_cell(a) + " ";
  CHECK(rank0.find("RG0.1 F3 B0.1 SA3 ") != std::string::npos);
  require_ok(check_invariants(full));
  require_ok(dry_run(full));
}

TEST_CASE("a2a overlap schedules keep the invariants, run without deadlock and pair different micro-batches",
          "[schedule][a2a_overlap]") {
  struct Case {
    ScheduleKind kind;
    PipelineLayout layout;
  };
  std::vector<Case> cases;
  for (int m : {1, 2, 3, 8}) cases.push_back({ScheduleKind::one_f_one_b, {1, 1, m}});
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int groups : {1, 2, 3}) cases.push_back({ScheduleKind::interleaved, {p, v, p * groups}});
  for (const Case& c : cases) {
    INFO("p " << c.layout.stages << " v " << c.layout.chunks_per_stage << " m " << c.layout.microbatches);
    const PairedSchedule paired = pair_forward_backward(must(build_schedule(c.kind, c.layout)));
    const Schedule full = hoist_pair_communication(must(insert_communication(paired.compute)), paired.pairs);
    require_ok(check_invariants(full));
    require_ok(dry_run(full));
    for (std::size_t r = 0; r < full.ranks.size(); ++r) {
      const auto& row = full.ranks[r];
      int pairs = 0, forwards = 0;
      for (const Action& a : row) forwards += a.kind == Action::forward ? 1 : 0;
      for (const Pair& p : paired.pairs) {
        if (p.forward.stage != static_cast<int>(r)) continue;
        ++pairs;
        // Adjacent after the hoist, and independent: the backward's own forward ran before the pair.
        const auto f = std::find(row.begin(), row.end(), p.forward);
        REQUIRE(f != row.end());
        REQUIRE(std::next(f) != row.end());
        CHECK(*std::next(f) == p.backward);
        CHECK(p.forward.microbatch != p.backward.microbatch);
        const Action own{Action::forward, p.backward.stage, p.backward.chunk, p.backward.microbatch};
        CHECK(std::find(row.begin(), f, own) != f);
      }
      // Every forward after the (one longer) warm-up pairs with a backward.
      const int total = c.layout.microbatches * c.layout.chunks_per_stage;
      const int warmup = c.kind == ScheduleKind::interleaved
                             ? std::min(interleaved_warmup(c.layout, static_cast<int>(r)) + 1, total)
                             : std::min(1, total);
      CHECK(forwards == total);
      CHECK(pairs == (warmup >= total ? 0 : total - warmup));
    }
  }
}
