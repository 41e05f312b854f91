// Grouped GEMMs (MoE experts over uneven token counts) timed from a
// calibration's measured grouped_gemm entries, the tile model kept where a
// calibration has none, and the loader's refusals of a malformed entry.
#include <catch2/catch.hpp>

#include <cmath>

#include "simulator/calibration.h"
#include "simulator/cost_model.h"

using namespace meshtrain::sim;

namespace {

const DeviceSpec kH100 = cluster_preset("dgx-h100")->device;

// Hand-made measurements of one expert shape (n 768, k 2048) at 4 experts: 16, 128 and 256 rows per expert
// take 40, 100 and 160 µs forward; wgrad 64 rows 50 µs. Decoys the lookup must pass over: another (n, k),
// 16 experts, another dtype.
Calibration grouped_calibration() {
  Calibration c;
  c.precision = DType::kBf16;
  c.grouped_gemm = {{4, 16, 768, 2048, DType::kBf16, 40},   {4, 128, 768, 2048, DType::kBf16, 100},
                    {4, 256, 768, 2048, DType::kBf16, 160}, {4, 64, 768, 2048, DType::kBf16, 50, true},
                    {4, 128, 7168, 4096, DType::kBf16, 9},  {16, 128, 768, 2048, DType::kBf16, 7},
                    {4, 128, 768, 2048, DType::kFp32, 5}};
  return c;
}

}  // namespace

TEST_CASE("a grouped GEMM of known uneven counts costs each expert's rows at the measured grouped throughput",
          "[simulator][cost][moe][calibration]") {
  const Calibration c = grouped_calibration();
  const CostModel m(kH100, CostConstants{}, &c);
  const double n = 768, k = 2048;
  auto flops = [&](double rows) { return 2 * rows * n * k; };
  // Per-expert throughput at the measured rows: 4 experts' FLOPs over the kernel's time.
  auto thr = [&](double rows, double us) { return 4 * flops(rows) / (us * 1e-6); };
  // Rows {1, 130, 256, 0}: 3 experts with tokens, nearest the 4-expert entries (not the 16-expert decoy).
  // 1 row: below the smallest measured rows (16), at its throughput.
  const double one = flops(1) / thr(16, 40);
  // 130 rows: between 128 and 256, the throughput linear in log(rows).
  const double t = (std::log(130.0) - std::log(128.0)) / (std::log(256.0) - std::log(128.0));
  const double one_thirty = flops(130) / (thr(128, 100) + t * (thr(256, 160) - thr(128, 100)));
  // 256 rows: a measured point, a quarter of the kernel's 160 µs; the empty expert: nothing.
  const double want = one + one_thirty + 160e-6 / 4;
  const std::vector<std::int64_t> rows = {1, 130, 256, 0};
  CHECK(*c.grouped_gemm_time(rows, 768, 2048, DType::kBf16, false) == Approx(want).epsilon(1e-12));
  CHECK(to_seconds(m.grouped_gemm(rows, 768, 2048, DType::kBf16)) == Approx(want).epsilon(1e-6));
  // Even counts at a measured entry give back its time; the expert with more rows costs more.
  CHECK(to_seconds(m.grouped_gemm({128, 128, 128, 128}, 768, 2048, DType::kBf16)) == Approx(100e-6).epsilon(1e-6));
  CHECK(m.grouped_gemm({256, 16, 16, 16}, 768, 2048, DType::kBf16) >
        m.grouped_gemm({16, 16, 16, 16}, 768, 2048, DType::kBf16));
  CHECK(m.grouped_gemm({0, 0, 0, 0}, 768, 2048, DType::kBf16) == 0);
  // Weight gradients read the wgrad entries: dW (2048 × 768) over 64 tokens in each of two experts is two
  // quarters of the measured 50 µs. The forward entries at 16..256 rows would give another time.
  CHECK(to_seconds(m.grouped_gemm_wgrad({64, 0, 64}, 2048, 768, DType::kBf16)) == Approx(25e-6).epsilon(1e-6));
  // FP8 without fp8 entries: the bf16 curve at FP8's peak.
  CHECK(to_seconds(m.grouped_gemm({128, 128, 128, 128}, 768, 2048, DType::kFp8)) ==
        Approx(100e-6 * kH100.peak_bf16_flops / kH100.peak_fp8_flops).epsilon(1e-6));
}

TEST_CASE("the nearest measured expert shape and expert count are the ones read", "[simulator][calibration][moe]") {
  const Calibration c = grouped_calibration();
  // 16 experts with tokens read the 16-expert entry: 16 × 128 rows of (768, 2048) in 7 µs.
  const std::vector<std::int64_t> sixteen(16, 128);
  CHECK(*c.grouped_gemm_time(sixteen, 768, 2048, DType::kBf16, false) == Approx(7e-6));
  // (7000, 4000) is nearest the (7168, 4096) decoy: its throughput at the query's own FLOPs.
  const double thr = 4 * 2.0 * 128 * 7168 * 4096 / 9e-6;
  CHECK(*c.grouped_gemm_time({128, 128, 128, 128}, 7000, 4000, DType::kBf16, false) ==
        Approx(4 * 2.0 * 128 * 7000 * 4000 / thr));
  // An expert shape beyond a factor of 2 of every measured one (n 128 against 768): nothing measured, and
  // the cost model keeps its tile model (a padded 512-row GEMM here).
  CHECK_FALSE(c.grouped_gemm_time({128, 128, 128, 128}, 128, 2048, DType::kBf16, false));
  CHECK(c.grouped_gemm_time({128, 128, 128, 128}, 1536, 1024, DType::kBf16, false));  // 2x each: still read
  const CostModel m(kH100, CostConstants{}, &c), bare(kH100, CostConstants{});
  CHECK(m.grouped_gemm({100, 100, 100, 100}, 128, 2048, DType::kBf16) == bare.gemm(512, 128, 2048, DType::kBf16));
  // No entries of that dtype or kind: nothing measured.
  CHECK_FALSE(c.grouped_gemm_time({128}, 768, 2048, DType::kFp8, false));
  Calibration forward_only = c;
  std::erase_if(forward_only.grouped_gemm, [](const Calibration::GroupedGemm& e) { return e.wgrad; });
  CHECK_FALSE(forward_only.grouped_gemm_time({128}, 768, 2048, DType::kBf16, true));
}

TEST_CASE("without grouped entries a grouped GEMM keeps the tile model", "[simulator][cost][moe][calibration]") {
  // A calibration of plain GEMMs only, one of them the padded total of rows {130, 0, 300, 1000} in 128-row
  // tiles (256 + 384 + 1024 = 1664 rows): the grouped kernel costs that GEMM's measured time, as before.
  Calibration c;
  c.precision = DType::kBf16;
  c.gemm = {{1664, 4096, 1024, DType::kBf16, 321.0}, {64, 64, 64, DType::kBf16, 3.0}};
  // Grouped entries of another dtype do not apply to a bf16 kernel.
  c.grouped_gemm = {{4, 128, 4096, 1024, DType::kFp32, 11}};
  const CostModel m(kH100, CostConstants{}, &c);
  CHECK(to_seconds(m.grouped_gemm({130, 0, 300, 1000}, 4096, 1024, DType::kBf16)) == Approx(321e-6).epsilon(1e-6));
  // Weight gradients: both groups' tiles in one launch. Each group's 1024 x 4096 gradient is 128 tiles of
  // 128x256, one wave of the H100's 132 SMs, so the two waves cost what the two GEMMs do, less one launch.
  const CostModel bare(kH100, CostConstants{});
  const Time wgrad = bare.grouped_gemm_wgrad({100, 0, 50}, 1024, 4096, DType::kBf16);
  CHECK(to_seconds(wgrad) == Approx(to_seconds(bare.gemm(1024, 4096, 100, DType::kBf16) +
                                               bare.gemm(1024, 4096, 50, DType::kBf16) - CostConstants{}.kernel_overhead))
                                 .epsilon(1e-6));
}

TEST_CASE("grouped entries round-trip, select by sharing level, and a file without them writes none",
          "[simulator][calibration]") {
  Calibration c = grouped_calibration();
  c.grouped_gemm.push_back({4, 128, 768, 2048, DType::kBf16, 180, false, {170, 190, 5, 2}});
  const std::string text = calibration_to_json(c);
  auto back = calibration_from_json(text);
  REQUIRE(back.ok());
  CHECK(calibration_to_json(*back) == text);
  REQUIRE(back->grouped_gemm.size() == c.grouped_gemm.size());
  CHECK(back->grouped_gemm[3].wgrad);
  CHECK(back->sharing_levels() == std::vector<int>{1, 2});
  CHECK(*back->for_ranks_sharing(2).grouped_gemm_time({128, 128, 128, 128}, 768, 2048, DType::kBf16, false) ==
        Approx(180e-6));
  CHECK(*back->for_ranks_sharing(1).grouped_gemm_time({128, 128, 128, 128}, 768, 2048, DType::kBf16, false) ==
        Approx(100e-6));
  auto old = calibration_from_json(R"({"version": 1, "gemm": [{"m": 8, "n": 8, "k": 8, "time_us": 1}]})");
  REQUIRE(old.ok());
  CHECK(old->grouped_gemm.empty());
  CHECK(calibration_to_json(*old).find("grouped_gemm") == std::string::npos);
  CHECK_THAT(calibration_coverage(*back, DType::kBf16).measured,
             Catch::VectorContains(std::string("grouped gemm bf16 (7 shapes)")));
  CHECK_THAT(calibration_coverage(*old, DType::kBf16).defaults,
             Catch::VectorContains(std::string("grouped gemm bf16 (tile model)")));
}

TEST_CASE("a malformed grouped entry is refused naming it", "[simulator][calibration]") {
  auto err = [](const std::string& entry) {
    auto r = calibration_from_json(R"({"version": 1, "grouped_gemm": [)" + entry + "]}");
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(err(R"({"rows": 16, "n": 768, "k": 2048, "time_us": 4})"),
             Catch::Contains("grouped_gemm[0]: missing field 'groups'"));
  CHECK_THAT(err(R"({"groups": 4, "rows": 0, "n": 768, "k": 2048, "time_us": 4})"),
             Catch::Contains("grouped_gemm[0]") && Catch::Contains("'rows' must be an integer in [1, "));
  CHECK_THAT(err(R"({"groups": 4, "rows": 16, "n": 768, "k": 2048, "time_us": 4, "wgrad": "yes"})"),
             Catch::Contains("grouped_gemm[0]: field 'wgrad' must be true"));
  CHECK_THAT(err(R"({"groups": 4, "rows": 16, "n": 768, "k": 2048, "time_us": 4, "dtype": "int8"})"),
             Catch::Contains("grouped_gemm[0]: field 'dtype' must be"));
  CHECK_THAT(err(R"({"groups": 4, "rows": 16, "n": 768, "k": 2048, "time_us": 4, "experts": 4})"),
             Catch::Contains("grouped_gemm[0]") && Catch::Contains("experts"));
  CHECK_THAT(err(R"({"groups": 4, "rows": 16, "n": 768, "k": 2048, "time_us": -1})"),
             Catch::Contains("grouped_gemm[0]") && Catch::Contains("time_us"));
  auto list = calibration_from_json(R"({"version": 1, "grouped_gemm": {"groups": 4}})");
  REQUIRE_FALSE(list.ok());
  CHECK_THAT(list.error().message(), Catch::Contains("field 'grouped_gemm' must be a list"));
}
