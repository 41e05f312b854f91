#include "simulator/cost_model.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

using namespace meshtrain::sim;

namespace {
const DeviceSpec kA100 = cluster_preset("dgx-a100")->device;
// The A100 without its SM count: GEMMs on the saturating shape curve (the cpu device's).
DeviceSpec without_sms(DeviceSpec d) {
  d.sm_count = 0;
  return d;
}
}  // namespace

TEST_CASE("roofline kernel times", "[simulator][cost]") {
  const CostConstants k;
  CostModel m(without_sms(kA100), k);
  const double oh = to_seconds(k.kernel_overhead);
  SECTION("large GEMM is compute bound at the saturated efficiency") {
    const double n = 8192;
    // 0.75: the sustained large-GEMM efficiency (constants.h), times the three shape factors.
    const double eff = 0.75 * std::pow(n / (n + 64), 3);
    CHECK(m.gemm_efficiency(8192, 8192, 8192) == Approx(eff));
    const double want = 2 * n * n * n / (312e12 * eff) + oh;
    CHECK(to_seconds(m.gemm(8192, 8192, 8192, DType::kBf16)) == Approx(want).epsilon(1e-6));
    // fp32 uses the fp32 peak.
    CHECK(to_seconds(m.gemm(8192, 8192, 8192, DType::kFp32)) ==
          Approx(2 * n * n * n / (19.5e12 * eff) + oh).epsilon(1e-6));
  }
  SECTION("small GEMMs are less efficient") {
    CHECK(m.gemm_efficiency(64, 64, 64) == Approx(0.75 / 8));  // each dimension at its half-size
    CHECK(m.gemm_efficiency(128, 8192, 8192) < m.gemm_efficiency(1024, 8192, 8192));
  }
  SECTION("a skinny GEMM is memory bound") {
    // k = 1: 2·8192² FLOPs but (8192 + 8192 + 8192²)·2 bytes.
    const double bytes = (8192.0 + 8192 + 8192.0 * 8192) * 2;
    CHECK(to_seconds(m.gemm(8192, 8192, 1, DType::kBf16)) ==
          Approx(bytes / (2.039e12 * 0.8) + oh).epsilon(1e-6));
  }
  SECTION("memory-bound kernels and attention") {
    CHECK(to_seconds(m.memory_bound(1e9)) == Approx(1e9 / (2.039e12 * 0.8) + oh).epsilon(1e-6));
    const double f = 4.0 * 256 * 2048.0 * 2048 * 128 / 2;  // causal
    const double eff = 0.6 * 2048.0 / (2048 + 256) * 128.0 / (128 + 32);
    CHECK(to_seconds(m.attention(256, 2048, 128, true, false, DType::kBf16)) ==
          Approx(f / (312e12 * eff) + oh).epsilon(1e-6));
    CHECK(to_seconds(m.attention(256, 2048, 128, true, true, DType::kBf16)) ==
          Approx(2.5 * f / (312e12 * eff) + oh).epsilon(1e-6));
  }
}

TEST_CASE("calibration replaces and interpolates", "[simulator][cost]") {
  Calibration cal;
  cal.gemm = {{1024, 1024, 1024, DType::kBf16, 100}, {4096, 4096, 4096, DType::kBf16, 4000}};
  cal.memory = {{1e6, 5}, {1e9, 600}};
  CostModel m(kA100, CostConstants{}, &cal);
  // Exact shapes: the measured time.
  CHECK(m.gemm(1024, 1024, 1024, DType::kBf16) == 100 * kMicrosecond);
  CHECK(m.gemm(4096, 4096, 4096, DType::kBf16, 3) == 3 * 4000 * kMicrosecond);
  // 2048³ lies halfway in log FLOPs between them (8× and 64×): throughput is
  // the mean of the two measured throughputs.
  const double f1 = 2.0 * 1024 * 1024 * 1024, f2 = 2.0 * 4096 * 4096 * 4096,
               fq = 2.0 * 2048 * 2048 * 2048;
  const double thr = (f1 / 100e-6 + f2 / 4000e-6) / 2;
  CHECK(to_seconds(m.gemm(2048, 2048, 2048, DType::kBf16)) == Approx(fq / thr).epsilon(1e-6));
  // Beyond the ends the throughput is held.
  CHECK(to_seconds(m.gemm(512, 512, 512, DType::kBf16)) ==
        Approx(2.0 * 512 * 512 * 512 / (f1 / 100e-6)));
  // No fp32 measurements: the roofline.
  CostModel plain(kA100, CostConstants{});
  CHECK(m.gemm(1024, 1024, 1024, DType::kFp32) == plain.gemm(1024, 1024, 1024, DType::kFp32));
  CHECK(to_seconds(m.memory_bound(1e9)) == Approx(600e-6));
}

TEST_CASE("calibration file round-trips and rejects bad input", "[simulator][cost]") {
  Calibration cal;
  cal.device = "A100-SXM4-80GB";
  cal.gemm = {{4096, 1024, 512, DType::kBf16, 12.345678901234}, {64, 64, 64, DType::kFp32, 3.1}};
  cal.attention = {{256, 2048, 128, true, 1830.25}};
  cal.memory = {{67108864, 41.5}};
  cal.links = {{"nvlink", 270.5}, {"nic", 23.1}};
  cal.collectives = {{CollectiveKind::kAllReduce, 8, 1073741824, 230.7}};
  const std::string text = calibration_to_json(cal);
  auto back = calibration_from_json(text);
  REQUIRE(back.ok());
  CHECK(calibration_to_json(*back) == text);
  CHECK(back->gemm[0].time_us == cal.gemm[0].time_us);
  CHECK(back->gemm[1].dtype == DType::kFp32);
  CHECK(back->attention[0].causal);
  CHECK(back->collectives[0].busbw_GBps == 230.7);
  const std::string path = "test_simulator_calibration.json";
  REQUIRE(save_calibration(cal, path).ok());
  auto loaded = load_calibration(path);
  REQUIRE(loaded.ok());
  CHECK(calibration_to_json(*loaded) == text);
  std::remove(path.c_str());
  // What the reader refuses is never written: an op measured at 0.0 µs (once written by calibrate) is named.
  Calibration zero = cal;
  zero.ops.push_back({"attention_score_terms", 4096, 0.0, {}});
  const meshtrain::Status refused = save_calibration(zero, path);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message(), Catch::Contains("not written") && Catch::Contains("time_us"));
  CHECK_FALSE(load_calibration(path).ok());  // no file

  auto spec = *cluster_preset("dgx-a100");
  apply_link_calibration(*back, spec);
  CHECK(spec.nvlink_bandwidth == 270.5e9);
  CHECK(spec.nic_bandwidth == 23.1e9);
  CHECK(back->collective_busbw(CollectiveKind::kAllReduce, 8, 1 << 20) == Approx(230.7e9));
  CHECK_FALSE(back->collective_busbw(CollectiveKind::kAllReduce, 16, 1 << 20).has_value());

  auto err = [](const char* t) {
    auto r = calibration_from_json(t);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(err(R"({"gemm": []})"), Catch::Contains("'version'"));
  CHECK_THAT(err(R"({"version": 2})"), Catch::Contains("version 2 is not supported"));
  CHECK_THAT(err(R"({"version": 1, "gemm": [{"m": 1, "n": 1, "time_us": 1}]})"),
             Catch::Contains("gemm[0]: missing field 'k'"));
  CHECK_THAT(err(R"({"version": 1, "memory": [{"bytes": 10, "time_us": -1}]})"),
             Catch::Contains("'time_us' is negative (-1); it must be a number in [0.001, 1000000000]"));
  CHECK_THAT(err(R"({"version": 1, "links": [{"kind": "ethernet", "GBps": 1}]})"),
             Catch::Contains("'kind' must be"));
  CHECK_THAT(err(R"({"version": 1, "kernels": []})"),
             Catch::Contains("unknown calibration field 'kernels'"));
}

TEST_CASE("calibrated collective busbw drives analytic collectives", "[simulator][cost]") {
  auto c = Cluster::build(*cluster_preset("dgx-h100"), 8);
  REQUIRE(c.ok());
  Calibration cal;
  cal.collectives = {{CollectiveKind::kAllReduce, 8, 1e6, 100},
                     {CollectiveKind::kAllReduce, 8, 1e9, 400}};
  CostConstants k;
  Simulator sim;
  Network net(sim, *c);
  CollectiveEngine eng(sim, net, k);
  eng.set_calibration(&cal);
  auto r = eng.analytic(
      {CollectiveKind::kAllReduce, {0, 1, 2, 3, 4, 5, 6, 7}, 1e9, Algorithm::kRing, 0});
  REQUIRE(r.ok());
  CHECK(to_seconds(r->second) == Approx(1e9 * 2 * 7 / 8 / 400e9));
}

TEST_CASE("a query window's attention is its share of the scores", "[simulator][cost][cp]") {
  // The share counted score by score: row t reads keys 0..t when causal, all T otherwise.
  auto counted = [](int T, int begin, int rows, bool causal) {
    double in = 0, all = 0;
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < T; ++j) {
        if (causal && j > t) continue;
        all += 1;
        if (t >= begin && t < begin + rows) in += 1;
      }
    return in / all;
  };
  for (bool causal : {true, false})
    for (int begin : {0, 3, 40}) CHECK(attention_window_share(64, begin, 8, causal) == Approx(counted(64, begin, 8, causal)));
  // Llama 3's pairing: chunks r and 2N-1-r of 2N cost every rank the same.
  const int T = 64, N = 4, c = T / (2 * N);
  for (int r = 0; r < N; ++r)
    CHECK(attention_window_share(T, r * c, c, true) + attention_window_share(T, (2 * N - 1 - r) * c, c, true) ==
          Approx(1.0 / N));
  const CostConstants k;
  CostModel m(kA100, k);
  const Time full = m.attention(256, 8192, 128, true, false, DType::kBf16);
  const Time half = m.attention_window(256, 8192, 128, true, false, DType::kBf16, 4096, 4096);
  CHECK(to_seconds(half - k.kernel_overhead) ==
        Approx(to_seconds(full - k.kernel_overhead) * attention_window_share(8192, 4096, 4096, true)).epsilon(1e-6));
  CHECK(m.attention_window(256, 8192, 128, true, false, DType::kBf16, 0, 0) == full);
}

TEST_CASE("a sliding window's attention is its share of the scores: Σ_t min(t + 1, W) of T(T + 1)/2",
          "[simulator][cost][attention-variants]") {
  // Counted score by score: causal row t reads min(t + 1, W) keys.
  auto counted = [](std::int64_t T, std::int64_t begin, std::int64_t rows, std::int64_t W) {
    double n = 0;
    for (std::int64_t t = begin; t < begin + rows; ++t) n += static_cast<double>(std::min(t + 1, W));
    return n / (static_cast<double>(T) * (T + 1) / 2);
  };
  // seq 4096, window 1024: 1024·1025/2 + 3072·1024 = 3,670,528 of 8,390,656 scores.
  CHECK(attention_window_share(4096, 0, 4096, true, 1024) == Approx(3670528.0 / 8390656.0).epsilon(1e-12));
  for (std::int64_t begin : {0, 100, 1000, 3000})
    CHECK(attention_window_share(4096, begin, 512, true, 1024) == Approx(counted(4096, begin, 512, 1024)));
  CHECK(attention_window_share(4096, 0, 4096, true, 8192) == Approx(1.0));  // a window past T: no effect
  const CostConstants k;
  const CostModel model(kA100, k);
  for (bool backward : {false, true}) {
    const Time full = model.attention(64, 4096, 128, true, backward, DType::kBf16);
    const Time local = model.attention_window(64, 4096, 128, true, backward, DType::kBf16, 0, 0, 1024);
    CHECK(to_seconds(local - k.kernel_overhead) ==
          Approx(to_seconds(full - k.kernel_overhead) * 3670528.0 / 8390656.0).epsilon(1e-6));
  }
}


TEST_CASE("without SMs a grouped GEMM pads each group's rows to the kernel's tile and runs them as one launch",
          "[simulator][cost][moe]") {
  const CostConstants k;
  const CostModel m(without_sms(kA100), k);
  const std::int64_t n = 4096, kk = 1024;
  // Experts with known uneven token counts: 130 rows take two 128-row tiles, 300 three, 1000 eight, an
  // empty expert none: 256 + 384 + 1024 = 1664 padded rows.
  const std::vector<std::int64_t> rows = {130, 0, 300, 1000};
  const double M = 1664;
  const double eff = k.gemm_efficiency_max * M / (M + k.gemm_m_half) * n / (n + k.gemm_n_half) * kk / (kk + k.gemm_k_half);
  const double compute = 2 * M * n * kk / (kA100.peak_bf16_flops * eff);
  const double memory = 2.0 * (M * kk + kk * n + M * n) / (kA100.memory_bandwidth * k.memory_efficiency);
  const double want = std::max(compute, memory) + to_seconds(k.kernel_overhead);
  CHECK(to_seconds(m.grouped_gemm(rows, n, kk, DType::kBf16)) == Approx(want).epsilon(1e-9));
  // Eight experts of 256 tokens: one launch at the efficiency of 2048 rows, faster than eight GEMMs of 256.
  const std::vector<std::int64_t> even(8, 256);
  CHECK(m.grouped_gemm(even, n, kk, DType::kBf16) < 8 * m.gemm(256, n, kk, DType::kBf16));
  CHECK(m.grouped_gemm(std::vector<std::int64_t>(4, 0), n, kk, DType::kBf16) == 0);
  // Weight gradients: each group reduces over its own tokens, one launch for all.
  const Time wgrad = m.grouped_gemm_wgrad({100, 0, 50}, kk, n, DType::kBf16);
  CHECK(wgrad == m.gemm(kk, n, 100, DType::kBf16) + m.gemm(kk, n, 50, DType::kBf16) - k.kernel_overhead);
}
