// A calibration's precision: what the file records, what simulate and plan
// accept, which dtype calibrate measures at, and that a bf16 simulation takes
// its GEMM times from the bf16 entries.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/calibrate/workload_shapes.h"
#include "engine/cli/plan_flags.h"
#include "engine/simulation/simulation.h"
#include "simulator/calibration.h"
#include "tests/calibrate/calibrate_cpu.h"
#include "tests/run_meshtrain.h"

namespace {

using meshtrain::sim::Calibration;
using meshtrain::sim::DType;

std::string write_file(const std::string& name, const std::string& text) {
  std::ofstream(name) << text;
  return name;
}

// A calibration file of one fp32 (or bf16) GEMM, as calibrate --backend cpu writes them, with
// `precision` as its top-level field ("" leaves it out, as files before the field did).
std::string calibration_text(const std::string& precision) {
  const std::string field = precision.empty() ? "" : "\"precision\": \"" + precision + "\", ";
  const std::string dtype = precision == "bf16" ? "bf16" : "fp32";
  return "{\"version\": 1, " + field + "\"gemm\": [{\"m\": 64, \"n\": 64, \"k\": 64, \"dtype\": \"" + dtype +
         "\", \"time_us\": 20}]}";
}

}  // namespace

TEST_CASE("a calibration records its precision, a file without the field is fp32", "[calibrate][precision]") {
  auto old = meshtrain::sim::calibration_from_json(calibration_text(""));
  REQUIRE(old.ok());
  CHECK(old->precision == DType::kFp32);
  auto bf16 = meshtrain::sim::calibration_from_json(calibration_text("bf16"));
  REQUIRE(bf16.ok());
  CHECK(bf16->precision == DType::kBf16);
  // Written and read back the same; the writer always states it.
  const std::string text = meshtrain::sim::calibration_to_json(*bf16);
  CHECK(nlohmann::json::parse(text).at("precision") == "bf16");
  auto again = meshtrain::sim::calibration_from_json(text);
  REQUIRE(again.ok());
  CHECK(again->precision == DType::kBf16);
  auto bad = meshtrain::sim::calibration_from_json("{\"version\": 1, \"precision\": \"fp8\"}");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("field 'precision'") && Catch::Contains("\"fp8\""));
}

TEST_CASE("simulate and plan refuse a calibration of another precision than the run's", "[calibrate][precision]") {
  const std::string fp32 = write_file("precision_fp32.json", calibration_text("fp32"));
  const std::string bf16 = write_file("precision_bf16.json", calibration_text("bf16"));
  const std::string old = write_file("precision_old.json", calibration_text(""));
  const std::string simulate = "simulate --model tiny --gpus 1 --cluster local-cpu --calibration ";

  // Matching: accepted, and its GEMM table is the one used.
  auto ok_bf16 = run_meshtrain(simulate + bf16 + " --precision bf16");
  INFO(ok_bf16.out);
  CHECK(ok_bf16.status == 0);
  CHECK_THAT(ok_bf16.out, Catch::Contains("measured gemm bf16 (1 shapes)"));
  CHECK(run_meshtrain(simulate + fp32 + " --precision fp32").status == 0);

  // Mismatched: refused, naming both precisions and the calibrate command that makes a matching file.
  auto refused = run_meshtrain(simulate + fp32 + " --precision bf16");
  CHECK(refused.status == 1);
  CHECK_THAT(refused.out, Catch::Contains("measured at precision fp32 but the run is bf16") &&
                              Catch::Contains("re-run `meshtrain calibrate --precision bf16 ...`") &&
                              Catch::Contains(fp32));
  auto refused_fp32 = run_meshtrain(simulate + bf16 + " --precision fp32");
  CHECK(refused_fp32.status == 1);
  CHECK_THAT(refused_fp32.out, Catch::Contains("measured at precision bf16 but the run is fp32") &&
                                   Catch::Contains("meshtrain calibrate --precision fp32"));
  // simulate's default precision is bf16: an fp32 file needs --precision fp32.
  CHECK_THAT(run_meshtrain(simulate + fp32).out, Catch::Contains("measured at precision fp32 but the run is bf16"));

  // A file from before the field: fp32.
  CHECK(run_meshtrain(simulate + old + " --precision fp32").status == 0);
  auto old_bf16 = run_meshtrain(simulate + old + " --precision bf16");
  CHECK(old_bf16.status == 1);
  CHECK_THAT(old_bf16.out, Catch::Contains("measured at precision fp32 but the run is bf16"));

  // plan applies the calibration through the same helper.
  auto plan = run_meshtrain("plan --model tiny --gpus 2 --cluster local-cpu --calibration " + fp32);
  CHECK(plan.status == 1);
  CHECK_THAT(plan.out, Catch::Contains("measured at precision fp32 but the run is bf16"));
  auto plan_ok = run_meshtrain("plan --model tiny --gpus 2 --cluster local-cpu --precision fp32 --calibration " + fp32);
  INFO(plan_ok.out);
  CHECK(plan_ok.status == 0);
  for (const std::string& f : {fp32, bf16, old}) std::remove(f.c_str());
}

TEST_CASE("calibrate chooses its precision as train does and refuses bf16 on the cpu backend",
          "[calibrate][precision]") {
  auto bf16 = run_meshtrain("calibrate --backend cpu --precision bf16 --out precision_x.json");
  CHECK(bf16.status == 1);
  CHECK_THAT(bf16.out, Catch::Contains("the cpu backend computes in fp32 only") &&
                           Catch::Contains("--precision fp32"));
  auto fp8 = run_meshtrain("calibrate --backend cpu --precision fp8 --out precision_x.json");
  CHECK(fp8.status == 1);
  CHECK_THAT(fp8.out, Catch::Contains("--precision") && Catch::Contains("bf16"));
  // Without --precision the cpu backend measures fp32 and says so in the file.
  const std::string path = "precision_cpu.json";
  const Calibration c =
      meshtrain::testing::calibrate_cpu(path, "--quick --no-grid --workload tiny:2:16 --sharing 1 --max-ranks 2")
          .calibration;
  std::remove(path.c_str());
  CHECK(c.precision == DType::kFp32);
  REQUIRE_FALSE(c.gemm.empty());
  for (const auto& g : c.gemm) CHECK(g.dtype == DType::kFp32);
}

TEST_CASE("the workload's shapes carry the dtypes of its step at the calibrated precision", "[calibrate][precision]") {
  using meshtrain::DType;
  auto m = meshtrain::model_preset("tiny");
  REQUIRE(m.ok());
  meshtrain::calibrate::WorkloadShapes bf16, fp32;
  REQUIRE(meshtrain::calibrate::record_workload_shapes(*m, 4, 32, meshtrain::Precision::bf16, bf16).ok());
  REQUIRE(meshtrain::calibrate::record_workload_shapes(*m, 4, 32, meshtrain::Precision::fp32, fp32).ok());
  // fp32: everything fp32.
  for (const auto& g : fp32.gemm) CHECK((g.in == DType::f32 && g.out == DType::f32));
  for (const auto& a : fp32.attention) CHECK(a.dtype == DType::f32);
  // bf16: the GEMMs read bf16 (the forward qkv, B·T = 128 rows, 64 -> 192, writes bf16) and attention runs in bf16.
  REQUIRE_FALSE(bf16.gemm.empty());
  for (const auto& g : bf16.gemm) CHECK(g.in == DType::bf16);
  CHECK(bf16.gemm.count({128, 192, 64, false, false, DType::bf16, DType::bf16}) == 1);
  REQUIRE_FALSE(bf16.attention.empty());
  for (const auto& a : bf16.attention) CHECK(a.dtype == DType::bf16);
  // The optimizer updates fp32 masters over the whole model; activations' ops are bf16.
  bool adamw = false, layernorm_bf16 = false;
  for (const auto& o : bf16.ops) {
    if (o.op == "adamw") {
      adamw = true;
      CHECK(o.dtype == DType::f32);
    }
    if (o.op == "layernorm_forward") layernorm_bf16 = layernorm_bf16 || o.dtype == DType::bf16;
  }
  CHECK(adamw);
  CHECK(layernorm_bf16);
}

namespace {

// One bf16 iteration of tiny (micro-batch 8, 64 tokens) on an h200 with `cal`:
// the iteration time and the summed durations of rank 0's GEMMs in the trace.
std::pair<double, double> simulate_bf16(const Calibration& cal) {
  meshtrain::PlanFlags flags;
  flags.model = "tiny";
  flags.overrides.micro_batch = 8;
  flags.overrides.global_batch = 8;
  flags.overrides.seq_len = 64;
  flags.overrides.precision = "bf16";
  auto mp = meshtrain::resolve_model_and_plan(flags, 1);
  REQUIRE(mp.ok());
  meshtrain::SimulateOptions options;
  auto cluster = meshtrain::sim::cluster_preset("h200");
  REQUIRE(cluster.ok());
  options.cluster = *cluster;
  options.calibration = &cal;
  options.trace = true;
  auto r = meshtrain::simulate_iteration(mp->model, mp->plan, options);
  REQUIRE(r.ok());
  double gemm_us = 0;
  const nlohmann::json trace = nlohmann::json::parse(r->trace_json);
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("pid", -1) == 0 && e.value("name", "") == "gemm")
      gemm_us += e.value("dur", 0.0);
  return {r->iteration_s, gemm_us};
}

// GEMM entries at one throughput (FLOP/s) over cubes 8..8192: every shape's time is then its
// FLOPs over that throughput (interpolation of a constant, constant beyond the ends).
void add_gemms(Calibration& c, DType dtype, double flops_per_s) {
  for (std::int64_t s = 8; s <= 8192; s *= 2)
    c.gemm.push_back({s, s, s, dtype, meshtrain::sim::gemm_flops(s, s, s) / flops_per_s * 1e6});
}

}  // namespace

TEST_CASE("a bf16 simulation takes its GEMM times from the calibration's bf16 entries", "[calibrate][precision]") {
  Calibration fast, slow, fast_with_fp32;
  for (Calibration* c : {&fast, &slow, &fast_with_fp32}) c->precision = DType::kBf16;
  add_gemms(fast, DType::kBf16, 400e12);
  add_gemms(slow, DType::kBf16, 100e12);
  add_gemms(fast_with_fp32, DType::kBf16, 400e12);
  add_gemms(fast_with_fp32, DType::kFp32, 10e12);  // a 40x slower fp32 table that a bf16 run must not read
  const auto [fast_s, fast_gemm_us] = simulate_bf16(fast);
  const auto [slow_s, slow_gemm_us] = simulate_bf16(slow);
  const auto [mixed_s, mixed_gemm_us] = simulate_bf16(fast_with_fp32);
  INFO("fast " << fast_s << " s (gemm " << fast_gemm_us << " us), slow " << slow_s << " s (gemm " << slow_gemm_us
               << " us), fast + fp32 table " << mixed_s << " s");
  REQUIRE(fast_gemm_us > 0);
  // A quarter of the throughput: four times the GEMM time (each GEMM's time is FLOPs / throughput, to the
  // simulator's nanosecond), and the iteration longer by that difference at least in part.
  CHECK(slow_gemm_us == Approx(4 * fast_gemm_us).epsilon(0.01));
  CHECK(slow_s > fast_s);
  // The fp32 entries change nothing.
  CHECK(mixed_s == fast_s);
  CHECK(mixed_gemm_us == fast_gemm_us);
}

TEST_CASE("calibrate --profile runs at the calibration's precision within its step budget", "[calibrate][precision]") {
  // A cpu calibration (one fp32 GEMM; the rest from the cost model's defaults) is enough to compare with.
  const std::string cpu_cal = write_file(
      "precision_profile_cpu.json",
      R"j({"version": 1, "device": "test cpu (cpu backend)", "precision": "fp32", "machine": {"backend": "cpu"},
           "gemm": [{"m": 64, "n": 64, "k": 64, "dtype": "fp32", "time_us": 20}]})j");
  // 1000 steps of ~5 ms would take 5 s; the 0.2 s budget stops them after a few dozen at most.
  auto r = run_meshtrain("calibrate --profile tiny:2:16 --calibration " + cpu_cal +
                         " --profile-steps 1000 --profile-budget 0.2");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("gemm") && Catch::Contains("fp32 step(s) timed on the cpu backend"));
  const auto at = r.out.find("simulated iteration");
  REQUIRE(at != std::string::npos);
  const auto semicolon = r.out.find("; ", at);
  REQUIRE(semicolon != std::string::npos);
  const int steps = std::stoi(r.out.substr(semicolon + 2));
  CHECK(steps >= 1);
  CHECK(steps < 1000);
  // The cpu backend computes in fp32 only: a bf16 calibration cannot be profiled on it.
  const std::string bf16_cal = write_file(
      "precision_profile_bf16.json",
      R"j({"version": 1, "device": "test cpu (cpu backend)", "precision": "bf16", "machine": {"backend": "cpu"}})j");
  auto refused = run_meshtrain("calibrate --profile tiny:2:16 --calibration " + bf16_cal);
  CHECK(refused.status == 1);
  CHECK_THAT(refused.out, Catch::Contains("is bf16 but the cpu backend runs fp32 only"));
  std::remove(cpu_cal.c_str());
  std::remove(bf16_cal.c_str());
}
