#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"

TEST_CASE("meshtrain info --json reports parameters and a rank's groups", "[cli]") {
  MeshtrainRun r = run_meshtrain("info --model gpt2-124m --tp 2 --pp 4 --dp 2 --rank 5 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["parameters"].get<long long>() == 124439808);
  CHECK(j["groups"]["tensor"] == nlohmann::json({4, 5}));
  CHECK(j["groups"]["pipeline"] == nlohmann::json({1, 5, 9, 13}));
  CHECK(j["groups"]["data"] == nlohmann::json({5, 7}));
  CHECK(j["groups"]["embedding"].is_null());
  CHECK(j["plan"]["world_size"] == 16);
  CHECK(j["memory"]["total_bytes"].get<double>() > 0);
}

TEST_CASE("meshtrain info rejects bad input with the validation message", "[cli]") {
  MeshtrainRun r = run_meshtrain("info --model tiny --tp 3");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("heads 4 are not divisible by tp 3"));
  MeshtrainRun typo = run_meshtrain("info --model tiny --schedule 1f1c");
  CHECK(typo.status != 0);
  CHECK_THAT(typo.out, Catch::Contains("did you mean '1f1b'"));
  MeshtrainRun rank = run_meshtrain("info --model tiny --rank 4");
  CHECK(rank.status != 0);
  CHECK_THAT(rank.out, Catch::Contains("--rank 4 is outside the world of 1 ranks"));
  MeshtrainRun not_a_number = run_meshtrain("info --tp two");
  CHECK(not_a_number.status != 0);
}

TEST_CASE("meshtrain info shows an MoE rank's expert groups and the active parameters", "[cli][moe]") {
  MeshtrainRun r = run_meshtrain("info --model mixtral-8x7b --tp 2 --pp 2 --dp 4 --ep 2 --rank 6 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["active_parameters"].get<double>() == Approx(12.88e9).epsilon(0.002));
  CHECK(j["groups"]["expert"] == nlohmann::json({4, 6}));
  CHECK(j["groups"]["expert_data"] == nlohmann::json({2, 6}));
  CHECK(j["groups"]["expert_tensor"] == nlohmann::json({6, 7}));
  CHECK(j["groups"]["expert_model"] == nlohmann::json({4, 5, 6, 7}));
  MeshtrainRun text = run_meshtrain("info --model mixtral-8x7b --tp 2 --pp 2 --dp 4 --ep 2 --rank 6");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Catch::Contains("expert tp 0 ep 1 edp 1 (experts 4..7)"));
  CHECK_THAT(text.out, Catch::Contains("expert_model"));
  MeshtrainRun refused = run_meshtrain("info --model tiny-moe --dp 2 --ep 4");
  CHECK(refused.status != 0);
  CHECK_THAT(refused.out, Catch::Contains("ep 4 must divide dp 2"));
}

TEST_CASE("meshtrain info names the model's modules, the names plan segments use", "[cli]") {
  MeshtrainRun vqa = run_meshtrain("info --model vqa-tiny");
  REQUIRE(vqa.status == 0);
  CHECK_THAT(vqa.out, Catch::Contains("modules    vision (blocks 0-2), projector (block 3), language (blocks 4-8)"));
  MeshtrainRun gpt = run_meshtrain("info --model gpt2-124m --json");  // 12 layers: blocks 0-13
  REQUIRE(gpt.status == 0);
  const auto modules = nlohmann::json::parse(gpt.out)["modules"];
  REQUIRE(modules.size() == 3);
  CHECK(modules[0] == nlohmann::json({{"name", "embed"}, {"first_block", 0}, {"last_block", 0}}));
  CHECK(modules[1] == nlohmann::json({{"name", "layers"}, {"first_block", 1}, {"last_block", 12}}));
  CHECK(modules[2] == nlohmann::json({{"name", "head"}, {"first_block", 13}, {"last_block", 13}}));
}
