// Offload simulated: the sim backend keeps host memory apart, times copies to
// and from it on the GPU's PCIe link and the host's AdamW at its rate
// (derived here from the preset's numbers), and a simulated offloaded
// iteration moves the bytes and saves the memory the parameter count says.
#include <catch2/catch.hpp>

#include "backends/sim/sim_backend.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"

using namespace meshtrain;

TEST_CASE("sim backend: host memory is counted apart, PCIe copies and the host AdamW take their rates",
          "[sim_backend][offload]") {
  auto spec = sim::cluster_preset("dgx-a100");
  REQUIRE(spec.ok());
  for (int world : {1, 8}) {
    auto cluster = SimCluster::create(*spec, world, {0});
    REQUIRE(cluster.ok());
    SimBackend& b = (*cluster)->backend(0);
    const std::int64_t n = 1 << 24;  // 64 MiB of fp32
    Tensor p = b.host_zeros(Shape{n}), g = b.host_zeros(Shape{n}), m = b.host_zeros(Shape{n}),
           v = b.host_zeros(Shape{n});
    Tensor d = b.empty(Shape{n});
    CHECK(b.memory_stats().live_bytes == 4 * n);
    CHECK(b.memory_stats().host_live_bytes == 16 * n);
    b.copy(d, g);  // down
    b.foreach_adamw(std::vector<AdamWTensors>{{p, g, m, v, 0.f}}, Tensor{}, AdamWOp{1e-3f});
    b.copy(p, d);  // up
    auto r = (*cluster)->run();
    REQUIRE(r.ok());
    // PCIe at 80% of the preset's line rate, halved when two GPUs of the job share a switch; AdamW moves
    // 28 bytes per parameter at 100 GB/s per node, shared by the node's GPUs of the job.
    const double pcie = spec->pcie_bandwidth * 0.8 / std::min(world, spec->gpus_per_pcie_switch);
    const double copy_s = 1e-12 * static_cast<double>(spec->pcie_latency) + 4.0 * n / pcie;
    const double adamw_s = 28.0 * n * std::min(world, spec->gpus_per_node) / 100e9;
    CHECK(r->iteration_s == Approx(2 * copy_s + adamw_s).epsilon(1e-6));
    CHECK(r->ranks[0].compute_s == 0);  // none of it is device compute
    CHECK(r->ranks[0].host_work.copy_bytes == 8.0 * n);
    CHECK(r->ranks[0].host_work.adamw_s == Approx(adamw_s).epsilon(1e-6));
    CHECK(r->ranks[0].host_peak_bytes == 16 * n);
  }
}

TEST_CASE("a simulated offloaded iteration saves the optimizer state's bytes and moves the gradients and values",
          "[sim_backend][offload]") {
  auto m = model_preset("gpt2-124m");
  REQUIRE(m.ok());
  Plan p;
  p.dp = 8, p.zero = 1, p.micro_batch = 2, p.global_batch = 16, p.seq_len = 256;
  p.precision = Precision::bf16;
  SimulateOptions o;
  o.cluster = *sim::cluster_preset("dgx-a100");
  auto base = simulate_iteration(*m, p, o);
  p.offload = Offload::optimizer;
  auto off = simulate_iteration(*m, p, o);
  REQUIRE(base.ok());
  REQUIRE(off.ok());
  const double n = static_cast<double>(count_shard_parameters(*m, 1, p.stage_split(), 1, 0, 1).total);
  // Mixed precision: the fp32 master, m and v (12 bytes) of the rank's 1/8; back come fp32 values and
  // down go fp32 gradients, 4 bytes each way per parameter it updates.
  const StageResult& s = off->stages[0];
  CHECK(s.model.offloaded == Approx(12 * n / 8));
  CHECK(static_cast<double>(base->stages[0].peak_bytes - s.peak_bytes) == Approx(12 * n / 8).epsilon(0.02));
  CHECK(s.host_work.copy_bytes == Approx(8 * n / 8).epsilon(0.001));
  CHECK(static_cast<double>(s.host_peak_bytes) == Approx(16 * n / 8).epsilon(0.001));
  // The host update follows backward (it needs the global norm): the iteration takes longer by about
  // its time. The copies hide: the gradients go down under backward, and each bucket's values go back
  // under the next bucket's update (its update takes longer than the copy), all but the last.
  CHECK(off->iteration_s > base->iteration_s + 0.5 * s.host_work.adamw_s);
  CHECK(off->iteration_s < base->iteration_s + s.host_work.adamw_s + 0.1 * s.host_work.copy_s);
}

TEST_CASE("offloaded gradients stream to the host as each bucket is reduced: the copies leave the critical path",
          "[sim_backend][offload]") {
  // gpt2-124m on one A100, ZeRO 1 over a group of one: two buckets (the first ceil(P/2) gradients
  // and the rest), each reduced (a device copy) as backward completes it. Streamed, bucket 1's copy
  // to the host runs under the second half of the last backward and bucket 0's under the host
  // update of bucket 1 (the update runs in landing order, and each bucket's update + copy back
  // takes longer than a copy down). With --grad-sync after-backward both copies start after
  // backward, and the host update waits for bucket 1's: the iteration is longer by that copy, less
  // the norm and clip coefficient computed meanwhile (tens of microseconds here).
  auto m = model_preset("gpt2-124m");
  REQUIRE(m.ok());
  auto spec = sim::cluster_preset("dgx-a100");
  REQUIRE(spec.ok());
  const std::int64_t n = count_shard_parameters(*m, 1, Plan{}.stage_split(), 1, 0, 1).total;
  const std::int64_t first = (n + 1) / 2;
  Plan p;
  p.zero = 1, p.micro_batch = 16, p.global_batch = 32, p.seq_len = 1024;
  p.precision = Precision::bf16;
  p.offload = Offload::optimizer;
  p.grad_bucket_mb = static_cast<double>(first) * 4 / (1 << 20);
  SimulateOptions o;
  o.cluster = *spec;
  auto streamed = simulate_iteration(*m, p, o);
  p.grad_sync = GradSync::after_backward;
  auto after = simulate_iteration(*m, p, o);
  REQUIRE(streamed.ok());
  REQUIRE(after.ok());
  const double pcie = spec->pcie_bandwidth * 0.8;
  const double copy_1 = 1e-12 * static_cast<double>(spec->pcie_latency) + 4.0 * static_cast<double>(n - first) / pcie;
  INFO("iteration streamed " << streamed->iteration_s << " s, after backward " << after->iteration_s
                             << " s, bucket 1's copy " << copy_1 << " s");
  CHECK(after->iteration_s - streamed->iteration_s == Approx(copy_1).epsilon(0.05));
  // The same bytes cross PCIe either way: the gradients down and the values up, 4 bytes each.
  CHECK(streamed->stages[0].host_work.copy_bytes == Approx(8.0 * static_cast<double>(n)).epsilon(0.001));
  CHECK(after->stages[0].host_work.copy_bytes == streamed->stages[0].host_work.copy_bytes);
  CHECK(after->stages[0].peak_bytes == streamed->stages[0].peak_bytes);
}
