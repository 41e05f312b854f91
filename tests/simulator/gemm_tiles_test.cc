// The tile model of GEMM kernels on a device with SMs (cost_model.h): each
// expectation is derived here by hand from the device's numbers, the output
// tile sizes the kernels offer and the two constants.
#include <catch2/catch.hpp>

#include "simulator/cost_model.h"

using namespace meshtrain::sim;

namespace {

// A device small enough to count by hand: 4 SMs of 1 TFLOP/s bf16 (2 fp8),
// each storing at 1 TB/s.
DeviceSpec four_sms() {
  DeviceSpec d;
  d.name = "four-sm";
  d.peak_bf16_flops = 4e12;
  d.peak_fp8_flops = 8e12;
  d.peak_fp32_flops = 1e12;
  d.memory_bytes = 1e12;
  d.memory_bandwidth = 4e12;
  d.sm_count = 4;
  return d;
}

// One tile's time on that device: its main loop, then its output stored (bf16: 2 bytes an element).
double tile_seconds(double tm, double tn, double k, double per_sm_flops, double out_bytes = 2) {
  const CostConstants c;
  return 2 * tm * tn * k / (per_sm_flops * c.gemm_mainloop_efficiency) + out_bytes * tm * tn / 1e12;
}

// Kernel time without the launch: the busy time scaled from the main loop's burst level to the sustained one.
double sustained(double busy_seconds) {
  const CostConstants c;
  return busy_seconds * c.gemm_mainloop_efficiency / c.gemm_efficiency_max;
}

// What each test on that device starts from: the constants, the cost model and its kernel launch.
struct FourSms {
  const CostConstants c;
  const CostModel m{four_sms(), c};
  const double oh = to_seconds(c.kernel_overhead);
};

}  // namespace

TEST_CASE_METHOD(FourSms, "a GEMM whose tiles fill the SMs once keeps the main loop's share of each tile",
                 "[simulator][cost][gemm-tiles]") {
  // 256 x 512 outputs: four 128x256 tiles, one wave (so are eight 128x128 in two waves, and sixteen of
  // 64x128 or 128x64 in four: the same time). k = 4096.
  const double tile = tile_seconds(128, 256, 4096, 1e12);
  const double main_loop = 2.0 * 128 * 256 * 4096 / (1e12 * c.gemm_mainloop_efficiency);
  CHECK(m.gemm_efficiency(256, 512, 4096) == Approx(c.gemm_efficiency_max * main_loop / tile).epsilon(1e-12));
  CHECK(to_seconds(m.gemm(256, 512, 4096, DType::kBf16)) == Approx(sustained(tile) + oh).epsilon(1e-6));
  // A long reduction hides the epilogue: the efficiency approaches the sustained level.
  CHECK(m.gemm_efficiency(256, 512, 1 << 24) == Approx(c.gemm_efficiency_max).epsilon(1e-5));
  // FP8: the main loop at twice the rate, the bf16 epilogue as long as before, so a smaller share of peak.
  const double fp8_tile = tile_seconds(128, 256, 4096, 2e12);
  CHECK(to_seconds(m.gemm(256, 512, 4096, DType::kFp8)) == Approx(sustained(fp8_tile) + oh).epsilon(1e-6));
  CHECK(m.gemm_efficiency(256, 512, 4096, DType::kFp8) < m.gemm_efficiency(256, 512, 4096, DType::kBf16));
}

TEST_CASE_METHOD(FourSms,
                 "a GEMM accumulating into an fp32 output reads and writes 8 bytes an element in its epilogue",
                 "[simulator][cost][gemm-tiles]") {
  // A weight gradient summed into an fp32 gradient (Megatron's gradient_accumulation_fusion): the one-wave
  // 256 x 512 shape, k = 4096 tokens; the epilogue reads the fp32 tile and writes it back.
  const GemmOutput accumulate{4, true};
  CHECK(to_seconds(m.gemm(256, 512, 4096, DType::kBf16, 1, accumulate)) ==
        Approx(sustained(tile_seconds(128, 256, 4096, 1e12, 8)) + oh).epsilon(1e-6));
  CHECK(to_seconds(m.gemm(256, 512, 4096, DType::kBf16, 1, GemmOutput{4, false})) ==
        Approx(sustained(tile_seconds(128, 256, 4096, 1e12, 4)) + oh).epsilon(1e-6));
  // Into a bf16 gradient (Megatron-Core's grad_reduce_in_fp32 false): 2 bytes read and 2 written.
  CHECK(to_seconds(m.gemm(256, 512, 4096, DType::kBf16, 1, GemmOutput{2, true})) ==
        Approx(sustained(tile_seconds(128, 256, 4096, 1e12, 4)) + oh).epsilon(1e-6));
  // Grouped weight gradients alike: two experts' 64 x 128 gradients over 4096 tokens each, one wave.
  CHECK(to_seconds(m.grouped_gemm_wgrad({4096, 4096}, 64, 128, DType::kBf16, accumulate)) ==
        Approx(sustained(tile_seconds(64, 128, 4096, 1e12, 8)) + oh).epsilon(1e-6));
}

TEST_CASE_METHOD(FourSms, "one row more than the SMs hold costs a partial wave of the best tile",
                 "[simulator][cost][gemm-tiles]") {
  // 257 x 512: 128x256 tiles 3·2 = 6 (two waves of a whole tile); 128x128 3·4 = 12 (three waves of a
  // half); 64x128 5·4 = 20 and 128x64 3·8 = 24 (five and six waves of a quarter); 256x128 2·4 = 8 (two
  // waves of a half). Best: five quarter-tile waves, 1.25 of the 256-row GEMM's one whole-tile wave.
  const double quarter = tile_seconds(64, 128, 4096, 1e12);
  CHECK(to_seconds(m.gemm(257, 512, 4096, DType::kBf16)) == Approx(sustained(5 * quarter) + oh).epsilon(1e-6));
  const double whole = to_seconds(m.gemm(256, 512, 4096, DType::kBf16)) - oh;
  CHECK((to_seconds(m.gemm(257, 512, 4096, DType::kBf16)) - oh) / whole == Approx(1.25).epsilon(1e-3));
}

TEST_CASE_METHOD(FourSms, "a grouped GEMM's tiles share one launch and the busiest group adds the wave",
                 "[simulator][cost][gemm-tiles][moe]") {
  // Four experts of 64 tokens, n = 128, k = 4096: four 64x128 tiles, one wave of a quarter tile.
  const double quarter = tile_seconds(64, 128, 4096, 1e12);
  const Time even = m.grouped_gemm({64, 64, 64, 64}, 128, 4096, DType::kBf16);
  CHECK(to_seconds(even) == Approx(sustained(quarter) + oh).epsilon(1e-6));
  // One expert gets 65 tokens: five 64x128 tiles (two waves), or four 128x128 tiles (one wave of a half
  // tile): twice the time, for 1/256 more work. An empty expert costs nothing.
  CHECK(to_seconds(m.grouped_gemm({65, 64, 0, 64, 64}, 128, 4096, DType::kBf16)) ==
        Approx(sustained(2 * quarter) + oh).epsilon(1e-6));
  // On an H100, memory-bound when each expert's weights outweigh its few tokens: 4 x (2 x 4096 +
  // 4096 x 4096 + 2 x 4096) bf16 elements at the memory roofline (the 128 quarter tiles take 13 µs).
  const CostModel h100(cluster_preset("dgx-h100")->device, c);
  const double bytes = 4 * 2.0 * (2 * 4096 + 4096.0 * 4096 + 2 * 4096);
  CHECK(to_seconds(h100.grouped_gemm({2, 2, 2, 2}, 4096, 4096, DType::kBf16)) ==
        Approx(bytes / (3.35e12 * c.memory_efficiency) + oh).epsilon(1e-6));
  // Weight gradients: each expert's 64 x 128 gradient reduces over its own tokens (4096 and 2048): two
  // quarter tiles of different lengths in one wave, which lasts as long as the longer.
  CHECK(to_seconds(m.grouped_gemm_wgrad({4096, 0, 2048}, 64, 128, DType::kBf16)) ==
        Approx(sustained(tile_seconds(64, 128, 4096, 1e12)) + oh).epsilon(1e-6));
  // Ten such tiles (eight experts of 2048 tokens, two of 4096) over four SMs: three waves of the mean tile.
  std::vector<std::int64_t> tokens(8, 2048);
  tokens.insert(tokens.end(), {4096, 4096});
  const double mean = (8 * tile_seconds(64, 128, 2048, 1e12) + 2 * tile_seconds(64, 128, 4096, 1e12)) / 10;
  CHECK(to_seconds(m.grouped_gemm_wgrad(tokens, 64, 128, DType::kBf16)) == Approx(sustained(3 * mean) + oh).epsilon(1e-6));
}

TEST_CASE("the presets' SMs: a 4096-cubed GEMM on an H100 loses its partial last wave",
          "[simulator][cost][gemm-tiles]") {
  const CostConstants c;
  const DeviceSpec h100 = cluster_preset("dgx-h100")->device;
  REQUIRE(h100.sm_count == 132);
  CHECK(cluster_preset("dgx-a100")->device.sm_count == 108);
  CHECK(cluster_preset("h200")->device.sm_count == 132);
  CHECK(cluster_preset("local-cpu")->device.sm_count == 0);
  const CostModel m(h100, c);
  // 4096³: 128x256 tiles 32·16 = 512 (3.88 waves: 4), 128x128 1024 (7.76: 8 of a half), 64x128 and
  // 128x64 2048 (15.5: 16 of a quarter), 256x128 as 128x256. Each is four whole tiles' time.
  const double per_sm = 989e12 / 132, store = 3.35e12 / 132;
  const double tile = 2.0 * 128 * 256 * 4096 / (per_sm * c.gemm_mainloop_efficiency) + 2.0 * 128 * 256 / store;
  const double flops = 2.0 * 4096 * 4096 * 4096;
  CHECK(m.gemm_efficiency(4096, 4096, 4096) ==
        Approx(c.gemm_efficiency_max * flops / (4 * tile * 989e12 * c.gemm_mainloop_efficiency)).epsilon(1e-12));
}

TEST_CASE("cluster files give SMs and NVLink SHARP, and say what is wrong with them", "[simulator][gemm-tiles][nvls]") {
  auto a100 = cluster_spec_from_json(R"({"base": "dgx-a100", "device": {"sms": 84}, "nvlink_sharp": true})");
  REQUIRE(a100.ok());
  CHECK(a100->device.sm_count == 84);
  CHECK(a100->nvlink_sharp);
  for (const char* text : {R"({"base": "dgx-h100", "device": {"sms": -1}})", R"({"base": "dgx-h100", "device": {"sms": "132"}})",
                           R"({"base": "dgx-h100", "device": {"sms": 1.5}})"}) {
    auto bad = cluster_spec_from_json(text);
    INFO(text);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.error().message(), Catch::Contains("sms") && Catch::Contains("e.g. 132"));
  }
  auto sharp = cluster_spec_from_json(R"({"base": "dgx-h100", "nvlink_sharp": "yes"})");
  REQUIRE_FALSE(sharp.ok());
  CHECK_THAT(sharp.error().message(), Catch::Contains("nvlink_sharp") && Catch::Contains("NVLS"));
}
