// Sliding-window attention (alternating with global layers) and attention
// sinks under every parallel plan against the single-rank run: the window
// is masked by position, so a context-parallel rank's query rows read the
// keys of earlier chunks inside the window (all-gather); ring attention,
// whose blocks pair chunks without positions, is refused with a window and
// counts a row's sink once, in its own chunk's block.
#include "tests/parallel/parallel_check.h"

namespace meshtrain::testing {
namespace {

// Window 5 over 16 tokens: under cp 2 (chunks of 4) and cp 4 (chunks of 2) a row's window reaches back
// into one or two earlier chunks. Layers 0 and 2 local, 1 and 3 global; grouped-query (4 heads, 2 kv).
ModelSpec windowed_llama(bool window, bool sinks) {
  ModelSpec m = tiny_llama();
  m.name = fmt::format("tiny-llama-w{}-s{}", window ? 5 : 0, sinks);  // the reference cache keys on the name
  m.sliding_window = window ? 5 : 0;
  m.window_pattern = window ? 2 : 0;
  m.attention_sinks = sinks;
  return m;
}

Plan with_cp(Plan p, int cp, ContextComm comm) {
  p.cp = cp;
  p.cp_comm = comm;
  return p;
}

TEST_CASE("sliding window and sinks under tensor, sequence, pipeline and data parallelism match the single rank",
          "[parallel][attention-variants]") {
  const ModelSpec m = windowed_llama(true, true);
  check_matches_reference(m, make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  Plan sp = make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b);
  sp.sequence_parallel = true;
  check_matches_reference(m, sp);
  check_matches_reference(m, make_plan(1, 2, 1, 0, ScheduleKind::interleaved, 2));
  check_matches_reference(m, make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b));
}

TEST_CASE("sliding window and sinks under context parallelism match the single rank", "[parallel][attention-variants][cp]") {
  const ModelSpec m = windowed_llama(true, true);
  check_matches_reference(m, with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 2, ContextComm::all_gather));
  check_matches_reference(m, with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 4, ContextComm::all_gather));
  check_matches_reference(m, with_cp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b), 2, ContextComm::all_gather));
  // Ring attention: sinks merged once per row through the log-sum-exps.
  check_matches_reference(windowed_llama(false, true),
                          with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 4, ContextComm::ring));
  const Status ring = validate_plan(with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 2, ContextComm::ring), m);
  REQUIRE_FALSE(ring.ok());
  CHECK_THAT(ring.error().message(), Catch::Contains("sliding_window 5") && Catch::Contains("all_gather"));
}

}  // namespace
}  // namespace meshtrain::testing
