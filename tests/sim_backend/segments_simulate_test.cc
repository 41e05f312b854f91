// Plans made of segments in the simulator: every segment and boundary gets
// its compute and the bytes its ranks send (Backend::set_region), and the
// boundary bytes are what the reshard must move, counted here from the
// layouts independently of the engine.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/plan/segment_plan.h"
#include "engine/simulation/rank_classes.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "tests/segmented_plan.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;
using meshtrain::testing::segmented;

namespace {

// The plan segments refine: fp32, of the given global and micro-batch.
Plan fp32_plan(int global_batch, int micro_batch) {
  Plan p;
  p.global_batch = global_batch, p.micro_batch = micro_batch, p.precision = Precision::fp32;
  return p;
}

SimulationResult simulate(const ModelSpec& m, const Plan& p) { return simulated(m, p, on_cluster("dgx-a100")); }

const RegionResult& region(const SimulationResult& r, const std::string& name) {
  for (const RegionResult& g : r.regions)
    if (g.name.starts_with(name)) return g;
  FAIL("no region " << name);
  return r.regions.front();
}

}  // namespace

TEST_CASE("a boundary between disjoint ranks sends the activations once and their gradient to each tp rank",
          "[sim][segments]") {
  ModelSpec m = *model_preset("tiny");
  m.tied_embeddings = false;
  Plan base;
  base.global_batch = 8, base.micro_batch = 2, base.seq_len = 32, base.precision = Precision::fp32;
  const Plan p = segmented(m, base, R"([
      {"blocks": [0, 2], "tp": 2, "sequence_parallel": true, "ranks": [0, 1]},
      {"blocks": [3, 5], "pp": 2, "dp": 2, "microbatches": 2, "ranks": [2, 5]}])");
  const SimulationResult r = simulate(m, p);
  // The global batch's activations at the boundary: G·T rows of width H, fp32.
  const double activations = 8.0 * 32 * m.hidden * 4;
  // Forward: sequence parallelism gathers the two halves (each tp rank sends
  // its half), then tp rank 0 sends the whole to the consumer's single tp
  // rank. Backward: the consumer sends the gradient to both producer tp ranks.
  CHECK(region(r, "boundary 0").sent_bytes == Approx(activations / 2 * 2 + activations + 2 * activations));
  CHECK(region(r, "segment 0").ranks == 2);
  CHECK(region(r, "segment 1").ranks == 4);
  CHECK(region(r, "segment 0").compute_max_s > 0);
  CHECK(region(r, "segment 0").memory_bytes > 0);
}

TEST_CASE("a boundary on the same ranks moves by all-to-all only what changes rank", "[sim][segments]") {
  const ModelSpec m = *model_preset("swin-fmnist");
  const Plan p = segmented(m, fp32_plan(64, 16), R"([
      {"modules": ["embed"], "dp": 4},
      {"modules": ["stage1", "stage2"], "tp": 2, "dp": 2},
      {"modules": ["stage3", "stage4", "head"], "pp": 4, "microbatches": 4}])");
  const SimulationResult r = simulate(m, p);
  // The patch embedding's output: 14×14 tokens of width 32 per image.
  const double per_sample = 14.0 * 14 * 32 * 4;
  // Forward: replica d of the embedding (rank d, 16 images) feeds consumer
  // replica d / 2, whose two tp ranks are d / 2 · 2 and + 1: one of the two
  // is rank d itself, so each image crosses once. Backward: consumer tp rank
  // 0 (ranks 0 and 2) returns each image's gradient to the two embedding
  // ranks it came from, one of them itself.
  CHECK(region(r, "boundary 0").sent_bytes == Approx(64 * per_sample + 32 * per_sample));
  CHECK(region(r, "segment 2").ranks == 4);
  CHECK(r.regions.size() == 3 + 2 + 1);
}

TEST_CASE("the bytes all ranks send are the ring algorithms' wire bytes", "[sim][segments][bytes]") {
  // dp 4 without ZeRO: every rank all-reduces its fp32 gradients once,
  // sending 2·3/4 of them; the loss (4 bytes) is all-reduced over the same
  // group, and the gradient norm over single-rank groups sends nothing.
  const ModelSpec m = *model_preset("tiny");
  Plan p;
  p.dp = 4, p.micro_batch = 2, p.global_batch = 8, p.seq_len = 32, p.grad_bucket_mb = 1024;
  REQUIRE(validate_plan(p, m).ok());
  const SimulationResult r = simulate(m, p);
  const double grads = static_cast<double>(count_parameters(m).total) * 4;
  CHECK(r.sent_bytes == Approx(4 * 1.5 * (grads + 4)));
}

TEST_CASE("a plan made of segments simulates a few ranks per class of ranks that act alike", "[sim][segments]") {
  const ModelSpec m = *model_preset("swin-fmnist");
  const Plan p = segmented(m, fp32_plan(64, 4), R"([
      {"modules": ["embed"], "dp": 16},
      {"modules": ["stage1", "stage2"], "tp": 2, "dp": 8},
      {"modules": ["stage3", "stage4", "head"], "pp": 2, "dp": 8, "microbatches": 4}])");
  // Worked from the layouts: segment 1 puts rank r at tp r mod 2, dp r / 2;
  // segment 2 puts ranks 0-7 on stage 0 (dp r) and 8-15 on stage 1. At
  // boundary 1, replica d of segment 1 (samples 8d..8d+7) feeds stage-0
  // rank d, which holds the same samples: only rank 0 (d = 0, tp 0) keeps
  // its own. Classes: {0}; odd ranks of stage 0 {1, 3, 5, 7}; even {2, 4, 6};
  // stage 1 by tp index of segment 1: {8, 10, 12, 14} and {9, 11, 13, 15}.
  // Representatives: the lowest of each, and 10, the pipeline peer of 2.
  const RankClasses c = rank_classes(p);
  CHECK(c.classes == 5);
  CHECK(c.representatives == std::vector<int>{0, 1, 2, 8, 9, 10});
  CHECK(c.stands_for == std::vector<int>{1, 4, 3, 3, 4, 1});
  CHECK(c.class_of[6] == c.class_of[2]);
  CHECK(c.class_of[10] == c.class_of[8]);

  SimulateOptions o = on_cluster("dgx-a100");
  const SimulationResult rep = simulated(m, p, o);
  o.fidelity = Fidelity::full;
  const SimulationResult full = simulated(m, p, o);
  CHECK(rep.stages.size() == 6);
  CHECK(full.stages.size() == 16);
  // Contention the representatives cannot see only slows full fidelity down, and not by much.
  CHECK(full.iteration_s >= rep.iteration_s * 0.999);
  CHECK(full.iteration_s <= rep.iteration_s * 1.05);
  // The classes' weights give every rank's bytes and every region's ranks.
  CHECK(rep.sent_bytes == Approx(full.sent_bytes).epsilon(1e-9));
  REQUIRE(rep.regions.size() == full.regions.size());
  for (std::size_t i = 0; i < rep.regions.size(); ++i) {
    CAPTURE(rep.regions[i].name);
    CHECK(rep.regions[i].ranks == full.regions[i].ranks);
    CHECK(rep.regions[i].sent_bytes == Approx(full.regions[i].sent_bytes).epsilon(1e-9));
    CHECK(rep.regions[i].compute_max_s == Approx(full.regions[i].compute_max_s).epsilon(1e-6));
  }
  CHECK(full.slowest_compute_s == Approx(full.median_compute_s).epsilon(1e-6));
}

TEST_CASE("a plan made of segments on disjoint ranks: representatives agree with every rank", "[sim][segments]") {
  ModelSpec m = *model_preset("tiny");
  m.tied_embeddings = false;
  Plan base;
  base.global_batch = 24, base.micro_batch = 2, base.seq_len = 32, base.precision = Precision::fp32;
  // Consumer replicas start as the producer's micro-batches holding their
  // samples arrive (the later replicas later), the consumer has more tp ranks
  // than the producer (producer ranks send to ranks of several classes), and
  // micro-batches of 3 against 2 samples split pieces unevenly.
  for (const char* layout : {R"([
      {"blocks": [0, 2], "tp": 2, "dp": 2, "ranks": [0, 3]},
      {"blocks": [3, 5], "pp": 2, "dp": 4, "microbatches": 3, "ranks": [4, 11]}])",
                             R"([
      {"blocks": [0, 2], "dp": 2, "microbatches": 4, "ranks": [0, 1]},
      {"blocks": [3, 5], "tp": 2, "dp": 2, "microbatches": 6, "ranks": [2, 5]}])"}) {
    CAPTURE(layout);
    const Plan p = segmented(m, base, layout);
    SimulateOptions o = on_cluster("dgx-a100");
    const SimulationResult rep = simulated(m, p, o);
    o.fidelity = Fidelity::full;
    const SimulationResult full = simulated(m, p, o);
    CHECK(full.iteration_s >= rep.iteration_s * 0.999);
    CHECK(full.iteration_s <= rep.iteration_s * 1.05);
    CHECK(rep.sent_bytes == Approx(full.sent_bytes).epsilon(1e-9));
    // The means weigh each representative by its class: they are every rank's.
    CHECK(rep.idle_fraction == Approx(full.idle_fraction).margin(0.01));
    CHECK(rep.bubble_fraction == Approx(full.bubble_fraction).margin(0.01));
  }
}

TEST_CASE("a plan made of segments without tensor parallelism waits for no model-parallel communication",
          "[sim][segments]") {
  const ModelSpec m = *model_preset("swin-fmnist");
  const Plan p = segmented(m, fp32_plan(64, 16), R"([
      {"modules": ["embed"], "dp": 4},
      {"modules": ["stage1", "stage2"], "dp": 4},
      {"modules": ["stage3", "stage4", "head"], "pp": 4, "microbatches": 4}])");
  // The loss and gradient-norm reduction over every rank, and the early
  // segments' data-parallel reductions, wait for the last segment's stages
  // to drain: the pipeline's idle, not exposed TP/CP/EP communication.
  for (const Fidelity f : {Fidelity::representative, Fidelity::full}) {
    SimulateOptions o = on_cluster("dgx-a100");
    o.fidelity = f;
    const SimulationResult r = simulated(m, p, o);
    CHECK(r.idle.model_parallel_s == 0.0);
    CHECK(r.idle.pipeline_s > 0.0);
  }
}

TEST_CASE("a plan made of segments on 1024 GPUs simulates no more ranks than on 16", "[sim][segments]") {
  const ModelSpec m = *model_preset("swin-fmnist");
  Plan base;
  base.global_batch = 4096, base.micro_batch = 4;
  const Plan p = segmented(m, base, R"([
      {"modules": ["embed"], "dp": 1024},
      {"modules": ["stage1", "stage2"], "tp": 2, "dp": 512},
      {"modules": ["stage3", "stage4", "head"], "pp": 2, "dp": 512, "microbatches": 4}])");
  const SimulationResult r = simulated(m, p, on_cluster("dgx-a100"));
  CHECK(r.stages.size() == 6);
  int ranks = 0;
  for (const StageResult& s : r.stages) ranks += s.ranks;
  CHECK(ranks == 1024);
  CHECK(region(r, "segment 2").ranks == 1024);
}

TEST_CASE("the whole plan's overlap_p2p_comm goes to the segments that interleave, one before the last is refused",
          "[sim_backend][segments][overlap]") {
  ModelSpec m = small_gpt();
  m.tied_embeddings = false;
  Plan base = fp32_plan(8, 1);
  base.overlap_p2p_comm = true;
  // The first segment runs GPipe (every segment before the last does), the second interleaves.
  const Plan p = segmented(m, base,
                           R"([{"blocks": [0, 0]}, {"blocks": [1, 13], "pp": 2, "vpp": 2, "schedule": "interleaved",
                               "ranks": [1, 2]}])");
  REQUIRE(p.segments.size() == 2);
  CHECK_FALSE(p.segments[0].overlap_p2p_comm);
  CHECK(p.segments[1].overlap_p2p_comm);
  CHECK(simulate(m, p).iteration_s > 0);
  // Given to a segment before the last, it is refused, naming the segment.
  auto refused = segments_from_json(
      nlohmann::json::parse(R"([{"blocks": [0, 6], "pp": 2, "overlap_p2p_comm": true}, {"blocks": [7, 13]}])"), m,
      fp32_plan(8, 1));
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message(),
             Catch::Contains("segment 0") && Catch::Contains("drop \"overlap_p2p_comm\" from this segment"));
  // The whole plan's, with no segment that interleaves: refused, not dropped.
  Plan overlapped = fp32_plan(8, 1);
  overlapped.overlap_p2p_comm = true;
  auto none = segments_from_json(
      nlohmann::json::parse(R"([{"blocks": [0, 6], "pp": 2}, {"blocks": [7, 13]}])"), m, overlapped);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.error().message(), Catch::Contains("no segment interleaves"));
}
