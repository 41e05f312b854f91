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
