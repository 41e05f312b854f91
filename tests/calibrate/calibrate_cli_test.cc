// meshtrain calibrate: the file it writes, and its errors.
#include <catch2/catch.hpp>

#include "models/parameters.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "simulator/calibration.h"
#include "tests/calibrate/calibrate_cpu.h"
#include "tests/run_meshtrain.h"

using meshtrain::sim::Calibration;
using meshtrain::sim::CollectiveKind;
using meshtrain::testing::calibrate_cpu;

TEST_CASE("calibrate --quick writes a versioned calibration that states the machine",
          "[calibrate]") {
  const std::string path = "test_calibrate_quick.json";
  const auto quick = calibrate_cpu(path, "--quick --no-grid --workload tiny:4:32 --sharing 1 2 --max-ranks 2");
  CHECK_THAT(quick.run.out, Catch::Contains("calibrate ["));  // the progress line
  const Calibration& c = quick.calibration;
  // Made without mpirun: it cannot time an MPI run, and simulate says how to get one that can.
  auto mpi = run_meshtrain("simulate --cluster local-cpu --gpus 2 --dp 2 --model tiny --precision fp32 "
                           "--calibration " + path + " --comm mpi");
  CHECK(mpi.status == 1);
  CHECK_THAT(mpi.out, Catch::Contains("no collectives measured over MPI") &&
                          Catch::Contains("mpirun -np N meshtrain calibrate"));
  auto threads = run_meshtrain("simulate --cluster local-cpu --gpus 2 --dp 2 --model tiny --precision fp32 "
                               "--calibration " + path + " --comm threads");
  CHECK(threads.status == 0);
  std::remove(path.c_str());
  CHECK(c.version == Calibration::kVersion);
  CHECK(c.machine.backend == "cpu");
  CHECK_FALSE(c.machine.cpu.empty());
  CHECK(c.machine.cores >= 1);
  CHECK(c.machine.date.size() == 20);  // 2026-12-02T14:00:00Z
  bool blas = false;
  for (const auto& [name, version] : c.machine.libraries) blas = blas || name == "OpenBLAS";
  CHECK(blas);
  bool mpi_note = false;
  for (const auto& n : c.machine.notes) mpi_note = mpi_note || n.rfind("mpi:", 0) == 0;
  CHECK(mpi_note);
  CHECK(c.sharing_levels() == std::vector<int>{1, 2});
  // The tiny workload's forward qkv GEMM (B·T = 128 rows, 64 -> 192) at both levels.
  CHECK(c.for_ranks_sharing(1).gemm_time(128, 192, 64, meshtrain::sim::DType::kFp32));
  CHECK(c.for_ranks_sharing(2).gemm_time(128, 192, 64, meshtrain::sim::DType::kFp32));
  CHECK(c.attention_backward_time(4 * 4, 32, 16, true));
  CHECK(c.op_time("gelu_forward", 1e5));
  // The optimizer's calls at their exact sizes, recorded from the workload's
  // own step: one multi-tensor AdamW and gradient norm over the tiny model's
  // one gradient bucket (AdamW moves param, grad, m, v and writes param, m, v:
  // 7 · N · 4 bytes, plus the 4-byte clip coefficient).
  auto measured = [&](const char* op, double bytes) {
    return std::any_of(c.ops.begin(), c.ops.end(),
                       [&](const auto& o) { return o.op == op && o.bytes == bytes; });
  };
  const double n = static_cast<double>(meshtrain::count_parameters(*meshtrain::model_preset("tiny")).total);
  CHECK(measured("adamw", 7 * n * 4 + 4));
  CHECK(measured("sum_squares", n * 4 + 4));
  CHECK(measured("bias_backward", 128 * 192 * 4 + 192 * 4));  // the qkv bias gradient
  for (const auto& g : c.gemm) {
    CHECK(g.spread.samples >= 3);
    CHECK(g.spread.p10_us <= g.time_us);
    CHECK(g.time_us <= g.spread.p90_us);
  }
  CHECK(c.collective_busbw(CollectiveKind::kAllReduce, 2, 1 << 16));
  CHECK(c.collective_busbw(CollectiveKind::kSendRecv, 2, 1 << 16));
  REQUIRE(c.links.size() == 1);
  CHECK(c.links[0].latency_us > 0);
}

TEST_CASE("calibrate times a Swin's attention score terms no faster than streaming their bytes", "[calibrate]") {
  // The terms are the scored attention's time minus the plain one's: noise made that 0.0 µs (a file the
  // reader refused) or a nanosecond. A copy of their bytes, measured beside them, is their floor.
  const std::string path = "test_calibrate_swin.json";
  const Calibration c =
      calibrate_cpu(path, "--quick --no-grid --workload swin-micro:2 --sharing 1 --max-ranks 2 --statistic mean")
          .calibration;
  std::remove(path.c_str());
  int terms = 0;
  for (const auto& o : c.ops) {
    if (o.op != "attention_score_terms") continue;
    ++terms;
    INFO(o.bytes << " bytes in " << o.time_us << " us");
    // 1 TB/s: beyond any memory this machine's cores can stream from (a nanosecond for 4 KB is 4 TB/s).
    CHECK(o.bytes / (o.time_us * 1e-6) < 1e12);
  }
  // Per windowed attention shape of the workload: bias alone and bias with mask, forward and backward.
  CHECK(terms >= 4);
  CHECK(terms % 4 == 0);
}

TEST_CASE("calibrate refuses what it cannot do, naming it", "[calibrate]") {
  // This test runs on machines without a GPU: a build without CUDA says so,
  // one with CUDA finds no device.
  auto cuda = run_meshtrain("calibrate --backend cuda --quick --no-grid --out x.json");
  CHECK(cuda.status == 1);
  CHECK_THAT(cuda.out, Catch::Contains("built without CUDA") || Catch::Contains("no CUDA device"));
  const struct {
    std::string args, says;
  } refused[] = {
      {"--backend tpu --out x.json", "cpu"},
      {"--backend cpu", "--out FILE is required"},
      {"--backend cpu --out x.json --workload tiny:8", "MODEL:MICRO_BATCH:SEQ_LEN"},
      {"--backend cpu --out x.json --statistic mode --quick", "--statistic"},
  };
  for (const auto& r : refused) check_refused("calibrate " + r.args, r.says);
}

TEST_CASE("calibrate measures an MoE workload's expert GEMMs as the simulator costs them", "[calibrate]") {
  // It aborted ("slice of 0 elements viewed as (64, 64)"): the sim backend holds no router choices, so
  // without a routing model every expert received no rows. Now it records the step under uniform routing.
  const std::string path = "test_calibrate_moe.json";
  const Calibration c =
      calibrate_cpu(path, "--quick --no-grid --workload tiny-moe:2:32 --sharing 1 --max-ranks 2").calibration;
  const auto m = *meshtrain::model_preset("tiny-moe");
  // 2 · 32 tokens, each to top_k experts, spread evenly over the experts.
  const std::int64_t rows = 2 * 32 * m.top_k / m.experts;
  auto grouped = [&](std::int64_t n, std::int64_t k, bool wgrad) {
    return std::any_of(c.grouped_gemm.begin(), c.grouped_gemm.end(), [&](const auto& g) {
      return g.groups == m.experts && g.rows == rows && g.n == n && g.k == k && g.wgrad == wgrad;
    });
  };
  // tp 1: the up projection (hidden -> ffn) and the down one (ffn -> hidden), forward and weight gradient.
  for (bool wgrad : {false, true}) {
    CHECK(grouped(m.ffn, m.hidden, wgrad));
    CHECK(grouped(m.hidden, m.ffn, wgrad));
  }
  CHECK(std::any_of(c.ops.begin(), c.ops.end(), [](const auto& o) { return o.op == "moe_route"; }));
  auto sim = run_meshtrain("simulate --cluster local-cpu --gpus 2 --dp 2 --model tiny-moe --precision fp32 "
                           "--micro-batch 2 --seq-len 32 --comm threads --calibration " + path);
  std::remove(path.c_str());
  INFO(sim.out);
  CHECK(sim.status == 0);
  CHECK_THAT(sim.out, Catch::Contains("grouped gemm fp32"));
}
