// FP8 GEMMs in the simulator: the devices' FP8 peaks, the cost model's FP8
// GEMM time (the bf16 efficiency curve at the FP8 peak, or a calibration's
// fp8 entries, or its bf16 ones scaled to the FP8 peak) and "fp8" in files.
#include <catch2/catch.hpp>

#include <cmath>

#include "simulator/calibration.h"
#include "simulator/cluster_spec.h"
#include "simulator/cost_model.h"

using namespace meshtrain::sim;

TEST_CASE("presets carry the dense FP8 peaks of their datasheets", "[simulator][fp8]") {
  CHECK(cluster_preset("dgx-h100")->device.peak_fp8_flops == 1979e12);
  CHECK(cluster_preset("h200")->device.peak_fp8_flops == 1979e12);
  CHECK(cluster_preset("dgx-a100")->device.peak_fp8_flops == 0);  // Ampere has no FP8 tensor cores
}

TEST_CASE("an FP8 GEMM's main loop runs at the FP8 peak, its bf16 epilogue as long as bf16's",
          "[simulator][fp8][cost]") {
  const CostConstants k;
  const CostModel h100(cluster_preset("dgx-h100")->device, k);
  const double oh = to_seconds(k.kernel_overhead);
  // 1536 x 2816: 132 tiles of 128x256 (or 264 of 128x128, 528 of a quarter), one whole-tile wave of the
  // 132 SMs. A tile: its main loop at the SM's share of peak, then its bf16 output at the SM's share of HBM.
  const double per_sm_bf16 = 989e12 / 132 * k.gemm_mainloop_efficiency, store = 3.35e12 / 132;
  const double main_loop = 2.0 * 128 * 256 * 8192 / per_sm_bf16, epilogue = 2.0 * 128 * 256 / store;
  const double to_sustained = k.gemm_mainloop_efficiency / k.gemm_efficiency_max;
  const double bf16 = to_seconds(h100.gemm(1536, 2816, 8192, DType::kBf16));
  const double fp8 = to_seconds(h100.gemm(1536, 2816, 8192, DType::kFp8));
  CHECK(bf16 == Approx((main_loop + epilogue) * to_sustained + oh).epsilon(1e-6));
  CHECK(fp8 == Approx((main_loop * 989 / 1979 + epilogue) * to_sustained + oh).epsilon(1e-6));
  // So FP8 gains less than the peaks' ratio, and less the shorter the reduction.
  CHECK((fp8 - oh) / (bf16 - oh) > 989.0 / 1979);
  // Memory bound (one row): FP8 operands move half the bytes: (8192 + 8192² + 8192)·1 byte.
  const double bytes = 8192.0 + 8192.0 * 8192 + 8192;
  CHECK(to_seconds(h100.gemm(1, 8192, 8192, DType::kFp8)) == Approx(bytes / (3.35e12 * 0.8) + oh).epsilon(1e-6));
}

TEST_CASE("calibration files carry fp8 GEMM entries", "[simulator][fp8][calibration]") {
  const std::string text = R"({"version": 1, "precision": "bf16", "gemm": [
      {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "time_us": 200},
      {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp8", "time_us": 120}]})";
  auto c = calibration_from_json(text);
  REQUIRE(c.ok());
  REQUIRE(c->gemm.size() == 2);
  CHECK(c->gemm[1].dtype == DType::kFp8);
  CHECK(*c->gemm_time(4096, 4096, 4096, DType::kFp8) == Approx(120e-6));
  CHECK(std::string(dtype_name(DType::kFp8)) == "fp8");
  // Written back as "fp8".
  CHECK(calibration_to_json(*c).find("\"fp8\"") != std::string::npos);

  const DeviceSpec h100 = cluster_preset("dgx-h100")->device;
  SECTION("a measured fp8 entry is the FP8 GEMM's time") {
    CHECK(to_seconds(CostModel(h100, CostConstants{}, &*c).gemm(4096, 4096, 4096, DType::kFp8)) == Approx(120e-6));
  }
  SECTION("without fp8 entries, the measured bf16 time at the FP8 peak") {
    c->gemm.pop_back();
    CHECK(to_seconds(CostModel(h100, CostConstants{}, &*c).gemm(4096, 4096, 4096, DType::kFp8)) ==
          Approx(200e-6 * 989 / 1979));
  }
  auto bad = calibration_from_json(R"({"version": 1, "gemm": [{"m": 1, "n": 1, "k": 1, "dtype": "fp4", "time_us": 1}]})");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("\"fp8\"") && Catch::Contains("gemm[0]"));
}

TEST_CASE("fp8_split GEMM entries: the split accumulator's, else the fast accumulator's time", "[simulator][fp8][calibration]") {
  const std::string text = R"({"version": 1, "precision": "bf16", "gemm": [
      {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "time_us": 200},
      {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp8", "time_us": 120},
      {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp8_split", "time_us": 135}]})";
  auto c = calibration_from_json(text);
  REQUIRE(c.ok());
  REQUIRE(c->gemm.size() == 3);
  CHECK(c->gemm[2].dtype == DType::kFp8Split);
  CHECK(std::string(dtype_name(DType::kFp8Split)) == "fp8_split");
  CHECK(calibration_to_json(*c).find("\"fp8_split\"") != std::string::npos);  // written back by name
  const DeviceSpec h100 = cluster_preset("dgx-h100")->device;
  auto split_s = [&](const Calibration& cal) {
    return to_seconds(CostModel(h100, CostConstants{}, &cal).gemm(4096, 4096, 4096, DType::kFp8Split));
  };
  CHECK(split_s(*c) == Approx(135e-6));
  c->gemm.pop_back();
  CHECK(split_s(*c) == Approx(120e-6));  // no split entry: the fast accumulator's
  c->gemm.pop_back();
  CHECK(split_s(*c) == Approx(200e-6 * 989 / 1979));  // nor a fast one: the bf16 time at the FP8 peak
  // Without a calibration the two accumulators cost alike (no public table to tell them apart).
  const CostModel model(h100, CostConstants{});
  CHECK(model.gemm(2048, 2048, 8192, DType::kFp8Split) == model.gemm(2048, 2048, 8192, DType::kFp8));
  // The coverage of an fp8 run names both.
  const CalibrationCoverage coverage = calibration_coverage(*calibration_from_json(text), DType::kFp8);
  CHECK_THAT(coverage.measured, Catch::VectorContains(std::string("gemm fp8_split (1 shapes)")));
}

TEST_CASE("a cluster file gives or inherits the FP8 peak", "[simulator][fp8][cluster]") {
  auto inherit = cluster_spec_from_json(R"({"base": "dgx-h100", "device": {"name": "my-h100"}})");
  REQUIRE(inherit.ok());
  CHECK(inherit->device.peak_fp8_flops == 1979e12);
  auto own = cluster_spec_from_json(R"({"base": "dgx-a100", "device": {"fp8_TFLOPS": 700}})");
  REQUIRE(own.ok());
  CHECK(own->device.peak_fp8_flops == 700e12);
  auto none = cluster_spec_from_json(R"({"base": "dgx-h100", "device": {"fp8_TFLOPS": 0}})");
  REQUIRE(none.ok());
  CHECK(none->device.peak_fp8_flops == 0);
  auto bad = cluster_spec_from_json(R"({"base": "dgx-h100", "device": {"fp8_TFLOPS": -1}})");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("fp8_TFLOPS"));
}
