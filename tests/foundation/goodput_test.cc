// Goodput under failures (engine/simulation/goodput.h): the formula against a Monte
// Carlo run of failures and restarts, its optimum against Young's and
// Daly's first-order intervals, and `meshtrain goodput`.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/simulation/goodput.h"
#include "tests/run_meshtrain.h"

using namespace meshtrain;

namespace {

GoodputInputs inputs(double checkpoint_s, double mtbf_s, double restart_s = 600, double iteration_s = 10) {
  GoodputInputs in;
  in.iteration_s = iteration_s;
  in.checkpoint_s = checkpoint_s;
  in.restart_s = restart_s;
  in.job_mtbf_s = mtbf_s;
  REQUIRE(check_goodput_inputs(in).ok());
  return in;
}

// Segments of τ work + C checkpoint under Poisson failures; a failure
// (during work, checkpoint or restart) restarts from the last checkpoint.
double monte_carlo(const GoodputInputs& in, double tau, int segments, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> next_failure(1.0 / in.job_mtbf_s);
  double wall = 0;
  double until_failure = next_failure(rng);
  for (int s = 0; s < segments; ++s) {
    for (;;) {
      const double need = tau + in.checkpoint_s;
      if (until_failure >= need) {
        wall += need;
        until_failure -= need;
        break;
      }
      wall += until_failure;  // lost
      until_failure = next_failure(rng);
      // Restart; a failure during it starts it again.
      while (until_failure < in.restart_s) {
        wall += until_failure;
        until_failure = next_failure(rng);
      }
      wall += in.restart_s;
      until_failure -= in.restart_s;
    }
  }
  return segments * tau / wall;
}

}  // namespace

TEST_CASE("goodput agrees with a Monte Carlo run of failures and restarts", "[goodput]") {
  std::printf("goodput Monte Carlo seed 17\n");
  // Frequent failures, so that a few hundred thousand segments see many.
  const GoodputInputs in = inputs(120, 4 * 3600, 900);
  for (double tau : {600.0, 1800.0, 3 * 3600.0}) {
    CAPTURE(tau);
    CHECK(monte_carlo(in, tau, 200000, 17) == Approx(goodput(in, tau)).epsilon(0.01));
  }
  // Without failures only checkpoints cost time.
  const GoodputInputs never = inputs(60, 1e15, 600);
  CHECK(goodput(never, 3600) == Approx(3600.0 / 3660.0).epsilon(1e-9));
}

TEST_CASE("the optimal checkpoint interval matches Young and Daly when checkpoints are cheap", "[goodput]") {
  for (double ratio : {1e-4, 1e-3, 1e-2}) {  // C / MTBF
    CAPTURE(ratio);
    const double M = 48 * 3600.0;
    const GoodputInputs in = inputs(ratio * M, M);
    const double best = optimal_interval_s(in);
    // It is the maximum: nearby intervals do worse.
    for (double f : {0.9, 0.99, 1.01, 1.1}) CHECK(goodput(in, best) >= goodput(in, best * f));
    // Young's √(2CM) is first order in √(C/M); Daly's is closer.
    const double young = young_interval_s(in);
    CHECK(young == Approx(std::sqrt(2 * ratio * M * M)));
    CHECK(std::abs(best / young - 1) < 1.5 * std::sqrt(ratio));
    CHECK(std::abs(best / daly_interval_s(in) - 1) < 0.6 * ratio + 1e-6);
  }
  // Whole steps: the best step count brackets the continuous optimum.
  const GoodputInputs in = inputs(40, 48 * 3600.0, 600, 21);
  const GoodputPlan p = optimal_steps(in);
  CHECK(std::abs(p.interval_s - optimal_interval_s(in)) <= in.iteration_s);
  CHECK(p.goodput >= at_steps(in, p.steps - 1).goodput);
  CHECK(p.goodput >= at_steps(in, p.steps + 1).goodput);
}

TEST_CASE("meshtrain goodput reports the optimum for the simulated plan", "[goodput][cli]") {
  MeshtrainRun r = run_meshtrain(
      "goodput --model gpt2-350m --cluster dgx-a100 --gpus 64 --tp 8 --global-batch 64 --mtbf-hours 20000 "
      "--checkpoint-every 1000 --restart-minutes 5 --storage-GBps 2 --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["job_mtbf_s"].get<double>() == Approx(20000.0 * 3600 / 64));
  CHECK(j["checkpoint_bytes"].get<double>() > 12 * 350e6 * 0.9);
  CHECK(j["checkpoint_write_s"].get<double>() == Approx(j["checkpoint_bytes"].get<double>() / 2e9));
  const double young = j["young_interval_s"].get<double>();
  CHECK(j["optimal"]["interval_s"].get<double>() == Approx(young).epsilon(0.05));
  CHECK(j["given"]["goodput"].get<double>() <= j["optimal"]["goodput"].get<double>());
  MeshtrainRun bad = run_meshtrain("goodput --model gpt2-350m --gpus 8 --mtbf-hours 0");
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("--mtbf-hours"));
}

TEST_CASE("the wall time's shares sum to one and stay in [0, 1] however fast failures come", "[goodput]") {
  // Without failures: only checkpoints cost time, C / (τ + C) of it.
  const GoodputInputs never = inputs(60, 1e15, 600);
  const WallShares calm = wall_shares(never, 3600);
  CHECK(calm.training == Approx(3600.0 / 3660.0).epsilon(1e-9));
  CHECK(calm.checkpoints == Approx(60.0 / 3660.0).epsilon(1e-9));
  CHECK(calm.failures == Approx(0).margin(1e-9));
  // From rare failures to a job that fails every microsecond (E[T] overflows).
  for (double mtbf : {1e6, 3600.0, 60.0, 1.0, 1e-6}) {
    CAPTURE(mtbf);
    const GoodputInputs in = inputs(120, mtbf, 600, 1);
    for (double tau : {1.0, 600.0, 1e5}) {
      CAPTURE(tau);
      const WallShares w = wall_shares(in, tau);
      CHECK(w.training == Approx(goodput(in, tau)).margin(1e-12));
      CHECK(w.training + w.checkpoints + w.failures == Approx(1.0));
      for (double share : {w.training, w.checkpoints, w.failures}) {
        CHECK(share >= 0);
        CHECK(share <= 1);
      }
    }
  }
  // Failures every minute against a 10-minute restart: the best interval saves nothing.
  const GoodputInputs hopeless = inputs(120, 60, 600, 1);
  CHECK(optimal_steps(hopeless).goodput < kNoProgressGoodput);
}

TEST_CASE("meshtrain goodput says a job makes no progress instead of losing more than 100%", "[goodput][cli]") {
  // Every share printed is a percentage of the wall time.
  auto check_percentages = [](const std::string& out) {
    std::size_t at = 0;
    while ((at = out.find('%', at)) != std::string::npos) {
      std::size_t from = at;
      while (from > 0 && (std::isdigit(static_cast<unsigned char>(out[from - 1])) || out[from - 1] == '.')) --from;
      if (from < at) CHECK(std::stod(out.substr(from, at - from)) <= 100.0);
      ++at;
    }
  };
  // The job fails every 0.45 s (8 GPUs at 0.001 h) and restarts in 10 minutes.
  MeshtrainRun hopeless =
      run_meshtrain("goodput --model tiny --cluster h200 --gpus 8 --iteration-s 1 --mtbf-hours 0.001");
  INFO(hopeless.out);
  REQUIRE(hopeless.status == 0);
  CHECK_THAT(hopeless.out, Catch::Contains("no progress"));
  CHECK_THAT(hopeless.out, Catch::Contains("the job fails every 0.45 s on average, but restarting takes 10.0 min"));
  CHECK_THAT(hopeless.out, Catch::Contains("--mtbf-hours"));
  check_percentages(hopeless.out);
  // A job that could progress, checkpointing far too rarely (every 278 h against a job MTBF of 7.3 min).
  MeshtrainRun rare = run_meshtrain(
      "goodput --model gpt3-175b --cluster h200 --gpus 8192 --tp 8 --pp 16 --iteration-s 10 --mtbf-hours 1000 "
      "--checkpoint-every 100000");
  INFO(rare.out);
  REQUIRE(rare.status == 0);
  CHECK_THAT(rare.out, Catch::Contains("checkpoint more often, e.g. --checkpoint-every 17"));
  check_percentages(rare.out);
  MeshtrainRun json = run_meshtrain(
      "goodput --model gpt3-175b --cluster h200 --gpus 8192 --tp 8 --pp 16 --iteration-s 10 --mtbf-hours 1000 "
      "--checkpoint-every 100000 --json");
  REQUIRE(json.status == 0);
  const auto j = nlohmann::json::parse(json.out);
  CHECK_FALSE(j["given"]["makes_progress"].get<bool>());
  CHECK(j["optimal"]["makes_progress"].get<bool>());
  CHECK(j["optimal"]["goodput"].get<double>() + j["optimal"]["share_checkpoints"].get<double>() +
            j["optimal"]["share_failures"].get<double>() ==
        Approx(1.0));
}
