// Data-parallel reductions simulated as Megatron-Core runs them: its bucket
// rule, and the idle time they leave reported by cause (simulation_idle.h)
// rather than as a pipeline bubble.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/parallel/gradient_buckets.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

SimulationResult simulate(const ModelSpec& m, const Plan& p) {
  SimulateOptions o = on_cluster("dgx-h100");
  o.check_memory = false;
  return simulated(m, checked(p, m), o);
}

ModelSpec gpt() {
  ModelSpec m = *model_preset("gpt2-350m");
  m.seq_len = 2048;
  return m;
}

Plan data_parallel(int dp, int pp) {
  Plan p;
  p.dp = dp;
  p.pp = pp;
  p.zero = 1;
  p.micro_batch = 1;
  p.global_batch = 4 * dp;
  p.megatron_buckets = true;
  return p;
}

}  // namespace

TEST_CASE("Megatron-Core's bucket rule: max(40M, 1M·dp) on stage 0's first chunk, whole chunks elsewhere",
          "[sim_backend][data_parallel]") {
  // megatron/core/distributed/distributed_data_parallel.py: bucket_size =
  // max(40000000, 1000000 * dp size); None (one bucket) when the pipeline
  // rank is > 0 or the chunk is not the first (disable_bucketing).
  CHECK(megatron_bucket_elements(16, 0, 0) == 40'000'000);
  CHECK(megatron_bucket_elements(48, 0, 0) == 48'000'000);
  CHECK(megatron_bucket_elements(2048, 0, 0) == 2'048'000'000);
  CHECK(megatron_bucket_elements(48, 1, 0) > std::int64_t{1} << 40);
  CHECK(megatron_bucket_elements(48, 0, 1) > std::int64_t{1} << 40);
  // A plan with the rule and ZeRO 2 is refused: ZeRO 2/3 reduce a layer per bucket.
  Plan p = data_parallel(2, 1);
  p.zero = 2;
  const Status s = validate_plan(p, gpt(), 2);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("megatron_buckets") && Catch::Contains("zero 0 or 1"));
}

TEST_CASE("simulate: Megatron buckets give one reduce-scatter and all-gather per 40M parameters",
          "[sim_backend][data_parallel]") {
  const ModelSpec m = gpt();
  const SimulationResult r = simulate(m, data_parallel(16, 1));
  const double params = static_cast<double>(count_parameters(m).total);
  const auto buckets = static_cast<std::uint64_t>(std::ceil(params / 40e6));
  CHECK(r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kReduceScatter)].count == buckets);
  CHECK(r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllGather)].count == buckets);
}

TEST_CASE("simulate: without a pipeline there is no bubble, idle time is charged to its cause",
          "[sim_backend][data_parallel]") {
  const ModelSpec m = gpt();
  // 16 ranks on two nodes: each bucket's reduce-scatter crosses the network.
  const SimulationResult r = simulate(m, data_parallel(16, 1));
  CHECK(r.bubble_fraction == 0.0);
  CHECK(r.idle.pipeline_s == 0.0);
  REQUIRE(r.idle_fraction > 0.0);
  // The causes add up to the idle time; the reductions after the last
  // micro-batch's backward and the optimizer on the data-parallel stream are what it waits for.
  CHECK(r.idle.total() == Approx(r.idle_fraction * r.iteration_s).epsilon(1e-6));
  CHECK(r.idle.data_parallel_s + r.idle.optimizer_s > 0.9 * r.idle.total());
  CHECK(r.idle.data_parallel_s > 0.0);
  // A pipeline without data parallelism idles in its bubble alone.
  Plan pipe = data_parallel(1, 4);
  pipe.global_batch = 8;
  const SimulationResult q = simulate(m, pipe);
  CHECK(q.bubble_fraction > 0.1);
  CHECK(q.idle.pipeline_s == Approx(q.idle.total()).epsilon(0.02));
  CHECK(q.idle.data_parallel_s == 0.0);
}
