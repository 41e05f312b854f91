// Offload on the cuda backend: page-locked host memory counted apart from the
// device's, copies both ways, the host AdamW (the cpu backend's kernel run in
// stream order) giving the cpu backend's bits, and a tiny model's training
// with its optimizer state on the host giving the bits of the run without:
// the device AdamW kernel rounds every operation as the cpu backend's does
// (no FMA contraction), so where the update runs changes nothing. (When it
// contracted, one last-bit difference in a master weight flipped its bf16
// working copy and bf16 training drifted to 4.7e-3 relative in 5 steps.)
// Without a CUDA device each test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/parallel/parallel_harness.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

TEST_CASE("cuda host memory: page-locked, counted apart, copied both ways", "[cuda][gpu][offload]") {
  MT_GPU_OR_SKIP(gpu);
  const std::int64_t n = 1 << 20;
  const MemoryStats before = gpu.memory_stats();
  Tensor h = gpu.host_zeros(Shape{n});
  CHECK(gpu.memory_stats().host_live_bytes - before.host_live_bytes == 4 * n);
  CHECK(gpu.memory_stats().live_bytes == before.live_bytes);
  CHECK(down(gpu, h) == Vec(static_cast<std::size_t>(n), 0.f));
  const Vec x = random(static_cast<std::size_t>(n), 71);
  Tensor d = up(gpu, Shape{n}, x), back = gpu.empty(Shape{n});
  gpu.copy(d, h);     // device to host
  gpu.copy(h, back);  // host to device
  CHECK(down(gpu, h) == x);
  CHECK(down(gpu, back) == x);
}

TEST_CASE("cuda foreach_adamw on host tensors gives the cpu backend's bits", "[cuda][gpu][offload]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t n = 100003;  // not a multiple of a chunk
  const Vec p = random(n, 81), g = random(n, 82), m = random(n, 83, 0.1f);
  const Vec v = random_second_moment(n, 84);
  const AdamWOp op{1e-2f, 0.9f, 0.95f, 1e-8f, 0.f, 3};
  auto run = [&](Backend& b) {
    auto host = [&](const Vec& values) {
      Tensor t = b.host_zeros(Shape{n});
      b.write(t, values);
      return t;
    };
    Tensor tp = host(p), tg = host(g), tm = host(m), tv = host(v);
    Tensor coef = up(b, Shape{1}, Vec{0.5f});
    b.foreach_adamw(std::vector<AdamWTensors>{{tp, tg, tm, tv, 0.1f}}, coef, op);
    return std::vector<Vec>{down(b, tp), down(b, tm), down(b, tv)};
  };
  CHECK(run(gpu) == run(cpu));
}

TEST_CASE("cuda training with the optimizer offloaded matches training without", "[cuda][gpu][offload]") {
  MT_GPU_OR_SKIP(gpu);
  const ModelSpec m = meshtrain::testing::tiny_gpt();
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    INFO("precision " << precision_name(precision));
    Plan p = meshtrain::testing::make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
    p.precision = precision;
    meshtrain::testing::RankRun base, off;
    REQUIRE(meshtrain::testing::run_rank(gpu, m, p, base).ok());
    p.offload = Offload::optimizer;
    REQUIRE(meshtrain::testing::run_rank(gpu, m, p, off).ok());
    CHECK(off.losses == base.losses);
    CHECK(off.grad_norms == base.grad_norms);
    REQUIRE(off.state.size() == base.state.size());
    for (const auto& [name, values] : base.state) {
      INFO(name << ": relative error " << meshtrain::testing::relative_error(off.state.at(name), values));
      CHECK(off.state.at(name) == values);
    }
  }
}
