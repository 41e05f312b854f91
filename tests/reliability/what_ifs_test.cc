// Issue 29, class 4: what-ifs and statistics make sense. Before: a cable
// failed and degraded (or failed twice) was accepted, --moe-routing on a dense
// model was ignored, zipf:3 over 8 experts with top-2 routing reported a
// max/mean expert load of 6.69 (at most 8/2 = 4 is possible), and link
// what-ifs were not listed in the report.
#include <nlohmann/json.hpp>

#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

namespace {
const std::string kSim = "simulate --model tiny --cluster h200 --gpus 16 --dp 16";
}

TEST_CASE("contradictory or duplicated what-ifs on one cable are refused", "[reliability][what_ifs]") {
  expect_refusal(kSim + " --link-fail node0.nic0 --link-degrade node0.nic0:0.5",
                 "--link-degrade node0.nic0:0.5 and --link-fail node0.nic0 both change cable node0.nic0");
  expect_refusal(kSim + " --link-fail node0.nic0 --link-fail node0.nic0",
                 "--link-fail node0.nic0 and --link-fail node0.nic0 both change cable node0.nic0");
  expect_refusal(kSim + " --link-degrade node0.nic0:0.5 --link-degrade node0.nic0:0.25", "both change cable node0.nic0");
  expect_refusal(kSim + " --straggler 3:2 --straggler 3:1.5", "rank 3 is already a straggler");
}

TEST_CASE("a --moe-routing flag on a model without experts is refused", "[reliability][what_ifs]") {
  expect_refusal("simulate --model tiny --cluster h200 --gpus 8 --moe-routing zipf:1.2",
                 "--moe-routing zipf:1.2: the model has no experts, so there is nothing to route");
  CHECK(run_meshtrain("simulate --model tiny --cluster h200 --gpus 8 --moe-routing uniform").status == 0);
}

TEST_CASE("per-expert load with top-k routing stays within experts/k of the mean", "[reliability][what_ifs]") {
  // tiny-moe: 8 experts, top 2, so an expert takes at most half the assignments: max/mean <= 4.
  const MeshtrainRun r =
      run_meshtrain("simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --json --moe-routing zipf:3");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& moe = j.at("moe");
  CHECK(moe.at("expert_load_max_mean").get<double>() <= 4.0 + 1e-9);
  // zipf:3's first share is 1/ζ-ish 0.83 > 1/2: it is cut to exactly half.
  CHECK(moe.at("expert_load_max_mean").get<double>() == Approx(4.0));
  // Every expert's tokens still sum to the assignments (2 per token).
  double sum = 0, first = 0;
  for (const auto& t : moe.at("tokens_per_expert").at(0)) sum += t.get<double>();
  first = moe.at("tokens_per_expert").at(0).at(0).get<double>();
  CHECK(first == Approx(sum / 2));
  // A file routing everything to one expert: it gets half, the other seven share the rest evenly.
  const MeshtrainRun one = run_meshtrain("simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --json --moe-routing file:" +
                                         write_text("onehot.json", "[0, 0, 0, 0, 0, 0, 0, 1]"));
  INFO(one.out);
  REQUIRE(one.status == 0);
  const auto report = nlohmann::json::parse(one.out);
  const auto& t = report.at("moe").at("tokens_per_expert").at(0);
  CHECK(t.at(7).get<double>() == Approx(t.at(0).get<double>() * 7));
}

TEST_CASE("every applied what-if is listed in the report", "[reliability][what_ifs]") {
  const MeshtrainRun r = run_meshtrain(kSim + " --straggler 3:2 --link-degrade node0.nic1:0.5 --link-fail node1.nic2");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("what-if          1 straggler: rank 3 x2.00"));
  CHECK_THAT(r.out, Catch::Contains("what-if          cable node0.nic1 at 0.5 of its bandwidth"));
  CHECK_THAT(r.out, Catch::Contains("what-if          cable node1.nic2 failed"));
  const MeshtrainRun j = run_meshtrain(kSim + " --json --link-fail node1.nic2");
  REQUIRE(j.status == 0);
  CHECK(nlohmann::json::parse(j.out).at("what_ifs") == nlohmann::json::array({"cable node1.nic2 failed"}));
}

TEST_CASE("a --job run lists every applied link what-if, as a single run does", "[reliability][what_ifs]") {
  const std::string job = write_text("job16.json", R"({"name": "a", "model": "tiny", "gpus": "0-15", "plan": {"dp": 16}})");
  const std::string jobs = "simulate --cluster h200 --job " + job;
  const std::string what_ifs = " --link-degrade node1.nic0:0.5 --link-fail node0.nic1";
  const MeshtrainRun r = run_meshtrain(jobs + what_ifs);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("what-if          cable node1.nic0 at 0.5 of its bandwidth"));
  CHECK_THAT(r.out, Catch::Contains("what-if          cable node0.nic1 failed"));
  const MeshtrainRun j = run_meshtrain(jobs + what_ifs + " --json");
  INFO(j.out);
  REQUIRE(j.status == 0);
  CHECK(nlohmann::json::parse(j.out).at("what_ifs") ==
        nlohmann::json::array({"cable node1.nic0 at 0.5 of its bandwidth", "cable node0.nic1 failed"}));
  // With none applied the report says none: no line, an empty list.
  const MeshtrainRun plain = run_meshtrain(jobs);
  INFO(plain.out);
  REQUIRE(plain.status == 0);
  CHECK_THAT(plain.out, !Catch::Contains("what-if"));
  const MeshtrainRun plain_json = run_meshtrain(jobs + " --json");
  REQUIRE(plain_json.status == 0);
  CHECK(nlohmann::json::parse(plain_json.out).at("what_ifs") == nlohmann::json::array());
}
