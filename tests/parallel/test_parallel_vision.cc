// ViT and Swin under every kind of parallelism compute what the single-rank
// run computes (the same checks and tolerances as the decoder's plans in
// test_parallel.cc), ranks as threads.
#include <catch2/catch.hpp>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

ModelSpec vit() { return *model_preset("vit-tiny"); }
// 3 stages (grids 6, 3, 2; widths 16, 32, 64; heads 4, 4, 8): 6 Swin blocks and 2 mergings.
ModelSpec swin() { return *model_preset("swin-micro"); }

Plan sp(Plan p) {
  p.sequence_parallel = true;
  return p;
}

}  // namespace

TEST_CASE("ViT under tensor, sequence, pipeline and data parallelism matches the single-rank run",
          "[parallel][vision][vit]") {
  check_matches_reference(vit(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(vit(), make_plan(4, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(vit(), sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
  check_matches_reference(vit(), make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b));
  for (int zero : {1, 3}) check_matches_reference(vit(), make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b));
  check_matches_reference(vit(), sp(make_plan(2, 2, 2, 2, ScheduleKind::gpipe)));
}

TEST_CASE("Swin under tensor and sequence parallelism matches the single-rank run", "[parallel][vision][swin]") {
  check_matches_reference(swin(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(swin(), make_plan(4, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(swin(), sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
}

TEST_CASE("Swin under pipeline schedules, even and uneven, matches the single-rank run", "[parallel][vision][swin]") {
  check_matches_reference(swin(), make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(swin(), make_plan(1, 4, 1, 0, ScheduleKind::gpipe));
  check_matches_reference(swin(), make_plan(1, 2, 1, 0, ScheduleKind::interleaved, 2));
  // 3 + 5 blocks: the merge into the last stage's grid sits on stage 1.
  check_matches_reference(swin(), with_stage_layers(make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), 3, 5));
}

TEST_CASE("Swin under data parallelism, ZeRO 1-3 and recomputation matches the single-rank run",
          "[parallel][vision][swin]") {
  for (int zero : {0, 1, 2, 3}) check_matches_reference(swin(), make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b));
  Plan recompute = make_plan(2, 2, 1, 2, ScheduleKind::one_f_one_b);
  recompute.recompute = Recompute::full;
  check_matches_reference(swin(), recompute);
  check_matches_reference(swin(), sp(make_plan(2, 2, 2, 3, ScheduleKind::interleaved, 2)));
}

TEST_CASE("example batches hold blank images unstored, and a step on them is a step on stored zeros",
          "[parallel][vision]") {
  const ModelSpec m = vit();
  const Plan p = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  const HostBatch blank = example_batch(m, p.micro_batch, p.effective_seq_len(m));
  CHECK(blank.blank_pixels);
  CHECK(blank.pixels.empty());
  const HostBatch part = sample_range(blank, 1, 2);
  CHECK(part.blank_pixels);
  CHECK(part.batch == 1);
  HostBatch stored = blank;
  stored.blank_pixels = false;
  stored.pixels.assign(static_cast<std::size_t>(blank.batch * model_io(m, blank.seq).pixels_per_sample()), 0.f);
  std::vector<StepResult> results;
  for (const HostBatch& h : {blank, stored}) {
    const Status s = run_ranks(1, [&](int, Communicator& comm) -> Status {
      CpuBackend b(comm);
      const auto engine = make_engine(b, m, p, StepOptions{});
      MT_ASSIGN(const StepResult r,
                engine->step(std::vector<HostBatch>(static_cast<std::size_t>(p.microbatches()), h), 1e-3f, 1));
      results.push_back(r);
      return ok_status();
    });
    INFO((s.ok() ? std::string() : s.error().message()));
    REQUIRE(s.ok());
  }
  CHECK(results[0].loss == results[1].loss);
  CHECK(results[0].grad_norm == results[1].grad_norm);
}
