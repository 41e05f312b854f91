// Several jobs on one cluster (engine/simulation/shared_fabric.h): job files, their
// placement, and slowdowns that come from shared links only.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/simulation/shared_fabric.h"

using namespace meshtrain;

namespace {

JobSpec job(const std::string& name, const std::string& model, nlohmann::json plan, const std::string& gpus) {
  nlohmann::json j = {{"name", name}, {"model", model}, {"plan", plan}};
  if (!gpus.empty()) j["gpus"] = gpus;
  auto r = job_from_json(j, "unnamed", "");
  INFO((r.ok() ? std::string() : r.error().message()));
  REQUIRE(r.ok());
  return *r;
}

const nlohmann::json kPlan = {{"tp", 8}, {"dp", 4}, {"micro_batch", 4}, {"global_batch", 64}};

// Leaves of 2 nodes with thin uplinks: jobs whose data-parallel rings cross
// leaves share the spines.
SimulateOptions thin_fabric() {
  SimulateOptions o;
  auto spec = sim::cluster_spec_from_json(R"({"base": "dgx-a100", "nodes_per_leaf": 2, "spines": 2,
                                               "oversubscription": 2})");
  REQUIRE(spec.ok());
  o.cluster = *spec;
  return o;
}

}  // namespace

TEST_CASE("job files: model, plan, GPU ranges, and their errors", "[sim][jobs]") {
  const JobSpec a = job("A", "gpt2-350m", kPlan, "0-7,16-23,32-39,48-55");
  CHECK(a.plan.world_size() == 32);
  CHECK(a.gpus.size() == 32);
  CHECK(a.gpus[8] == 16);
  CHECK(*parse_gpu_ranges("3,5-6") == std::vector<int>{3, 5, 6});
  CHECK_THAT(parse_gpu_ranges("4-2").error().message(), Catch::Contains("ranges such as"));
  CHECK_THAT(parse_gpu_ranges("0-99999999").error().message(), Catch::Contains("must be an integer in [0, 1048575]"));
  CHECK_THAT(parse_gpu_ranges("0-1048575,0-1").error().message(), Catch::Contains("more than 1048576 GPUs"));
  auto error = [](nlohmann::json j) {
    auto r = job_from_json(j, "x", "");
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(error({{"model", "gpt2-350m"}, {"plan", kPlan}, {"gpu", "0-31"}}), Catch::Contains("gpus"));
  CHECK_THAT(error({{"model", "gpt2-350m"}, {"plan", kPlan}, {"gpus", "0-15"}}),
             Catch::Contains("16 GPUs given for a plan of 32 ranks"));
  CHECK_THAT(error({{"plan", kPlan}}), Catch::Contains("needs a model"));
  // Two jobs on one GPU.
  auto both = simulate_shared({a, job("B", "gpt2-350m", kPlan, "48-79")}, thin_fabric());
  REQUIRE_FALSE(both.ok());
  CHECK_THAT(both.error().message(), Catch::Contains("GPU 48 is placed in job 'A' and job 'B'"));
}

TEST_CASE("jobs that share uplinks slow each other and jobs that share nothing do not", "[sim][jobs]") {
  // A and B interleave their nodes, so each one's dp ring crosses leaves.
  const JobSpec a = job("A", "gpt2-350m", kPlan, "0-7,16-23,32-39,48-55");
  const JobSpec b = job("B", "gpt2-350m", kPlan, "8-15,24-31,40-47,56-63");
  auto thin = simulate_shared({a, b}, thin_fabric());
  REQUIRE(thin.ok());
  REQUIRE(thin->jobs.size() == 2);
  for (const auto& j : thin->jobs) {
    CHECK(j.iterations == 1);
    CHECK(j.slowdown() > 1.05);
  }
  // The same jobs on dgx-a100's non-blocking leaves (all 8 nodes under one leaf per rail): no shared link.
  SimulateOptions wide;
  wide.cluster = *sim::cluster_preset("dgx-a100");
  auto apart = simulate_shared({a, b}, wide);
  REQUIRE(apart.ok());
  for (const auto& j : apart->jobs) CHECK(j.slowdown() == Approx(1.0).epsilon(1e-9));
  // Alone, a job placed on GPUs 0..N-1 times what simulate_iteration times in full fidelity.
  SimulateOptions o = thin_fabric();
  o.fidelity = Fidelity::full;
  auto one = simulate_shared({job("solo", "gpt2-350m", kPlan, "")}, o);
  auto direct = simulate_iteration(job("solo", "gpt2-350m", kPlan, "").model, job("solo", "gpt2-350m", kPlan, "").plan, o);
  REQUIRE((one.ok() && direct.ok()));
  CHECK(one->jobs[0].alone_s == Approx(direct->iteration_s).epsilon(1e-12));
  CHECK(one->jobs[0].slowdown() == Approx(1.0).epsilon(1e-12));
}

TEST_CASE("a shorter job runs several iterations so that the jobs overlap", "[sim][jobs]") {
  const JobSpec big = job("big", "gpt2-350m", {{"tp", 8}, {"dp", 4}, {"micro_batch", 4}, {"global_batch", 128}},
                          "0-7,16-23,32-39,48-55");
  const JobSpec small = job("small", "gpt2-124m", {{"tp", 4}, {"dp", 8}, {"micro_batch", 2}, {"global_batch", 16}},
                            "8-11,24-27,40-43,56-59,12-15,28-31,44-47,60-63");
  auto r = simulate_shared({big, small}, thin_fabric());
  REQUIRE(r.ok());
  CHECK(r->jobs[0].iterations == 1);
  CHECK(r->jobs[1].iterations > 1);
  CHECK(r->jobs[1].alone_s * r->jobs[1].iterations == Approx(r->jobs[0].alone_s).epsilon(0.5));
  for (const auto& j : r->jobs) CHECK(j.slowdown() >= 1.0 - 1e-9);
}
