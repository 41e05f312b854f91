// The short cpu loop (experiments/validation/cpu-loop/run.py in miniature):
// calibrate once (the tiny workload at 1 and 2 ranks sharing the cores), then
// for a few plans of the tiny model with 4 micro-batches per replica train 15
// real steps, simulate the plan with that calibration on local-cpu, and fail
// when the worst prediction is off by more than 35% (loose: CI machines are
// noisy; the full loop's targets are 10% median and 20% worst). Steps of 2
// micro-batches (35 ms) and a --quick calibration (3 samples) let noise alone
// reach 28%; with these, worst errors of 9-23% were seen on an idle machine
// (before the cpu backend kept freed memory, the single rank page-faulted its
// activations back in every step: 65 ms measured against 35 predicted).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/run_meshtrain.h"

namespace {

struct Plan {
  const char* label;
  const char* flags;
  int world;
  int dp;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One attempt: calibrate, then train and simulate each plan; the worst
// relative error of the predicted step time.
double worst_error(const std::string& data, const std::string& cal, const std::string& metrics) {
  const Plan plans[] = {{"single", "", 1, 1},
                        {"tp2", "--tp 2", 2, 1},
                        {"pp2 1f1b", "--pp 2 --schedule 1f1b", 2, 1},
                        {"dp2 zero1", "--dp 2 --zero 1", 2, 2}};
  auto c = run_meshtrain(fmt::format(
      "calibrate --backend cpu --out {} --no-grid --workload tiny:8:64 --sharing 1 "
      "--sharing 2 --max-ranks 2 --statistic mean",
      cal));
  INFO(c.out);
  REQUIRE(c.status == 0);
  double worst = 0;
  for (const Plan& p : plans) {
    const std::string common = fmt::format(
        "--model tiny --micro-batch 8 --seq-len 64 --global-batch {} {}", 8 * 4 * p.dp, p.flags);
    std::remove(metrics.c_str());
    auto t = run_meshtrain(fmt::format(
        "train --data {} --steps 15 --warmup 1 --lr 1e-3 --quiet --metrics {} {}", data, metrics,
        common));
    INFO(t.out);
    REQUIRE(t.status == 0);
    std::vector<double> steps;
    std::ifstream m(metrics);
    for (std::string line; std::getline(m, line);)
      if (!line.empty()) steps.push_back(nlohmann::json::parse(line)["step_time_s"].get<double>());
    REQUIRE(steps.size() == 15);
    steps.erase(steps.begin(), steps.begin() + 3);  // warm-up
    const double measured = median(steps);
    auto s = run_meshtrain(fmt::format(
        "simulate --cluster local-cpu --gpus {} --calibration {} --precision fp32 --json {}",
        p.world, cal, common));
    INFO(s.out);
    REQUIRE(s.status == 0);
    const double predicted = nlohmann::json::parse(s.out)["iteration_time_s"].get<double>();
    const double error = (predicted - measured) / measured;
    std::printf("cpu loop: %-10s measured %8.2f ms  predicted %8.2f ms  error %+6.1f%%\n", p.label,
                measured * 1e3, predicted * 1e3, error * 100);
    worst = std::max(worst, std::abs(error));
  }
  return worst;
}

}  // namespace

// A second attempt when the first misses: a neighbour on a shared 2-vCPU
// machine can hold a whole plan's run off (one attempt on CI: 48% on the
// single rank, whose two threads wait on each other), while an error of the
// model itself shows in both attempts.
TEST_CASE("the simulator predicts real cpu steps within 35%", "[calibrate][loop]") {
  const std::string data = "test_cpu_loop_data.bin", cal = "test_cpu_loop_cal.json",
                    metrics = "test_cpu_loop_metrics.jsonl";
  {
    std::ofstream f(data, std::ios::binary);
    for (unsigned i = 0; i < 100000; ++i) f.put(static_cast<char>((i * 2654435761u) >> 13));
  }
  double worst = worst_error(data, cal, metrics);
  if (worst > 0.35) {
    std::printf("cpu loop: worst error %.1f%%; measuring once more\n", worst * 100);
    worst = worst_error(data, cal, metrics);
  }
  std::remove(data.c_str());
  std::remove(cal.c_str());
  std::remove(metrics.c_str());
  CHECK(worst <= 0.35);
}
