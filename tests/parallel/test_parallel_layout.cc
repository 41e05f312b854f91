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
