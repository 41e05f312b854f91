// Calibration's grouped GEMMs: the grid (shapes of fine-grained experts, each
// forward shape beside the plain GEMM of its total rows) and the measurement,
// run on the cpu backend over a small grid.
#include <catch2/catch.hpp>

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "engine/calibrate/grouped_grid.h"
#include "engine/calibrate/measure.h"
#include "tests/calibrate/quick_timing.h"

using namespace meshtrain;

TEST_CASE("the grouped grid covers rows per expert at expert shapes, forward and wgrad", "[calibrate][moe]") {
  const auto quick = calibrate::grouped_gemm_grid(true, false, DType::f32);
  // cpu quick: qwen3-30b-a3b's down-projection input gradient (n 768, k 2048), 4 experts, 16/64/256 rows.
  CHECK(quick.size() == 6);
  for (const auto& g : quick) {
    CHECK(g.groups == 4);
    CHECK((g.n == 768 && g.k == 2048));
    CHECK((g.rows == 16 || g.rows == 64 || g.rows == 256));
    CHECK(g.out == DType::f32);
  }
  const auto plain = calibrate::plain_gemms_of(quick);
  CHECK(plain.size() == 3);
  CHECK(plain.count(calibrate::GemmShape{4 * 256, 768, 2048, false, false, DType::f32, DType::f32}) == 1);
  // On a GPU at bf16: 16..4096 rows, 4 and 16 experts, six (n, k), weight gradients accumulated in fp32.
  const auto gpu = calibrate::grouped_gemm_grid(false, true, DType::bf16);
  CHECK(gpu.size() == 6 * 9 * 2 * 2);
  for (const auto& g : gpu) CHECK(g.out == (g.wgrad ? DType::f32 : DType::bf16));
  CHECK(std::any_of(gpu.begin(), gpu.end(), [](const auto& g) { return g.rows == 4096 && g.k == 7168; }));
}

TEST_CASE("grouped GEMMs are measured on the cpu backend, one entry per shape", "[calibrate][moe]") {
  CpuBackend b(CpuBackendOptions{1});
  const calibrate::Timing quick = testing::quick_timing(3, 1e-4);
  const std::vector<calibrate::GroupedGemmShape> shapes = {{3, 4, 8, 16, false, DType::f32, DType::f32},
                                                           {3, 4, 8, 16, true, DType::f32, DType::f32},
                                                           {2, 64, 32, 48, false, DType::f32, DType::f32}};
  std::size_t progress = 0;
  auto entries = calibrate::measure_grouped_gemm(b, shapes, quick, {}, 2, [&](std::size_t d) { progress = d; });
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == shapes.size());
  CHECK(progress == shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto& e = (*entries)[i];
    INFO(i);
    CHECK(e.groups == shapes[i].groups);
    CHECK(e.rows == shapes[i].rows);
    CHECK(e.n == shapes[i].n);
    CHECK(e.k == shapes[i].k);
    CHECK(e.wgrad == shapes[i].wgrad);
    CHECK(e.dtype == sim::DType::kFp32);
    CHECK(e.time_us > 0);
    CHECK(e.spread.samples == 3);
    CHECK(e.spread.ranks_sharing == 2);
    CHECK(e.spread.p10_us <= e.time_us);
    CHECK(e.time_us <= e.spread.p90_us);
  }
  // The entries read back as a calibration's, and the lookup returns the measured time.
  sim::Calibration c;
  c.grouped_gemm = *entries;
  CHECK(*c.grouped_gemm_time({64, 64}, 32, 48, sim::DType::kFp32, false) == Approx((*entries)[2].time_us * 1e-6));
}
