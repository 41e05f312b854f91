// The sim backend on its own: memory accounting, recorded task durations
// from the cost model, and collectives whose other members are not simulated.
#include <catch2/catch.hpp>

#include <vector>

#include "backends/sim/sim_backend.h"

using namespace meshtrain;

namespace {

std::unique_ptr<SimCluster> make_cluster(int world, std::vector<int> reps) {
  auto spec = sim::cluster_preset("dgx-a100");
  REQUIRE(spec.ok());
  auto c = SimCluster::create(*spec, world, std::move(reps));
  REQUIRE(c.ok());
  return std::move(c).value();
}

}  // namespace

TEST_CASE("sim backend: live and peak bytes are numel · dtype size of live storage", "[sim_backend]") {
  auto cluster = make_cluster(8, {0});
  SimBackend& b = cluster->backend(0);
  {
    Tensor a = b.empty(Shape{1000, 3});
    Tensor h = b.empty(Shape{7}, DType::bf16);
    CHECK(b.memory_stats().live_bytes == 12000 + 14);
    Tensor v = a.view(Shape{3000});  // a view shares the storage
    CHECK(b.memory_stats().live_bytes == 12014);
  }
  CHECK(b.memory_stats().live_bytes == 0);
  CHECK(b.memory_stats().peak_bytes == 12014);
  b.reset_peak();
  CHECK(b.memory_stats().peak_bytes == 0);
  Tensor x = b.empty(Shape{4}, DType::i32);
  std::vector<float> host(4, 1.f);
  REQUIRE(b.read(x, host).ok());
  CHECK(host == std::vector<float>(4, 0.f));
}

TEST_CASE("sim backend: a gemm takes the cost model's time, a solo tp all-reduce its analytic time",
          "[sim_backend]") {
  auto cluster = make_cluster(8, {0});
  SimBackend& b = cluster->backend(0);
  Tensor a = b.empty(Shape{4096, 1024}, DType::bf16), w = b.empty(Shape{1024, 2048}, DType::bf16);
  Tensor c = b.empty(Shape{4096, 2048}, DType::bf16);
  b.gemm(a, w, c, {});
  // Ranks 0..7 on one node; only rank 0 is simulated.
  const Group tp{1, {0, 1, 2, 3, 4, 5, 6, 7}};
  b.all_reduce(c, tp, ReduceOp::sum);
  auto r = cluster->run();
  REQUIRE(r.ok());
  const double gemm_s = static_cast<double>(cluster->cost_model().gemm(4096, 2048, 1024, sim::DType::kBf16)) / 1e12;
  sim::CollectiveRequest req{sim::CollectiveKind::kAllReduce, tp.ranks, static_cast<double>(c.bytes())};
  auto plan = sim::plan_collective(cluster->cluster(), sim::CostConstants{}, req);
  REQUIRE(plan.ok());
  const double ar_s = static_cast<double>(sim::analytic_time(cluster->cluster(), sim::CostConstants{}, *plan)) / 1e12;
  CHECK(r->ranks[0].compute_s == Approx(gemm_s));
  CHECK(r->iteration_s == Approx(gemm_s + ar_s).epsilon(1e-9));
  const auto& ar = r->collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllReduce)];
  CHECK(ar.count == 1);
  CHECK(ar.bytes == static_cast<double>(c.bytes()));
  CHECK(ar.time_s == Approx(ar_s));
  CHECK(r->tasks == 2);
}
