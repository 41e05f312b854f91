// `meshtrain plan` as a user runs it: the table, --json, --explain, --out
// read back by simulate, and named errors for bad flags.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"

TEST_CASE("plan prints a ranked table, explains the winner and writes a plan file simulate reads unchanged") {
  const std::string out = "plan_cli_test_winner.json";
  std::remove(out.c_str());
  const MeshtrainRun r = run_meshtrain("plan --model tiny --gpus 8 --global-batch 32 --simulate 8 --top 3 "
                                       "--explain --no-progress --out " + out);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("searched") && Catch::Contains("  1  tp ") && Catch::Contains("why tp ") &&
                        Catch::Contains("bubble: compute stream idle") && Catch::Contains("wrote the winner"));
  const MeshtrainRun j = run_meshtrain("plan --model tiny --gpus 8 --global-batch 32 --simulate 8 --json --no-progress");
  REQUIRE(j.status == 0);
  const auto report = nlohmann::json::parse(j.out);
  const double best = report["ranked"][0]["iteration_time_s"].get<double>();
  const MeshtrainRun s = run_meshtrain("simulate --model tiny --cluster dgx-a100 --gpus 8 --json --plan " + out);
  INFO(s.out);
  REQUIRE(s.status == 0);
  CHECK(nlohmann::json::parse(s.out)["iteration_time_s"].get<double>() == Approx(best).epsilon(1e-12));
  std::remove(out.c_str());
}

TEST_CASE("plan refuses bad flags by name") {
  const MeshtrainRun dim = run_meshtrain("plan --model tiny --gpus 8 --fix tq=2");
  CHECK(dim.status == 1);
  CHECK_THAT(dim.out, Catch::Contains("unknown plan dimension 'tq'") && Catch::Contains("did you mean 'tp'"));
  const MeshtrainRun contradict = run_meshtrain("plan --model tiny --gpus 8 --fix tp=2 --fix tp=4");
  CHECK(contradict.status == 1);
  CHECK_THAT(contradict.out, Catch::Contains("--fix tp=2 and --fix tp=4 contradict"));
  const MeshtrainRun fits = run_meshtrain("plan --model gpt3-175b --gpus 8 --no-progress");
  CHECK(fits.status == 1);
  CHECK_THAT(fits.out, Catch::Contains("no plan of gpt3-175b on 8 GPUs fits") && Catch::Contains("short"));
  const MeshtrainRun gpus = run_meshtrain("plan --model tiny");
  CHECK(gpus.status != 0);
  CHECK_THAT(gpus.out, Catch::Contains("--gpus"));
}
