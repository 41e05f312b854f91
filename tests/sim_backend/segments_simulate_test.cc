// Plans made of segments in the simulator: every segment and boundary gets
// its compute and the bytes its ranks send (Backend::set_region), and the
// boundary bytes are what the reshard must move, counted here from the
// layouts independently of the engine.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/plan/segment_plan.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

Plan segmented(const ModelSpec& m, Plan base, const char* segments) {
  auto parsed = segments_from_json(nlohmann::json::parse(segments), m, base);
  INFO((parsed.ok() ? std::string() : parsed.error().message()));
  REQUIRE(parsed.ok());
  base.segments = *parsed;
  const Status valid = validate_plan(base, m);
  INFO((valid.ok() ? std::string() : valid.error().message()));
  REQUIRE(valid.ok());
  return base;
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
  Plan base;
  base.global_batch = 64, base.micro_batch = 16, base.precision = Precision::fp32;
  const Plan p = segmented(m, base, R"([
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
