// GPU selection from the launchers' local-rank variables.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "backends/cuda/device_select.h"

using namespace meshtrain::cuda;

namespace {
EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("local rank comes from Open MPI, then Slurm, then LOCAL_RANK") {
  auto r = local_rank_from_env(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "5"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(3));
  r = local_rank_from_env(env({{"SLURM_LOCALID", "5"}, {"LOCAL_RANK", "1"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(5));
  r = local_rank_from_env(env({{"LOCAL_RANK", "1"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(1));
  r = local_rank_from_env(env({}));
  REQUIRE(r.ok());
  CHECK_FALSE(r->has_value());
}

TEST_CASE("malformed local ranks are refused with the variable named") {
  for (const char* bad : {"", "x", "-1", "2a", " 1"}) {
    auto r = local_rank_from_env(env({{"SLURM_LOCALID", bad}}));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains("SLURM_LOCALID"));
  }
}

TEST_CASE("the device is the local rank among the visible devices") {
  CHECK(*select_device(5, 8) == 5);
  CHECK(*select_device(std::nullopt, 8) == 0);
  CHECK(*select_device(5, 1) == 0);  // CUDA_VISIBLE_DEVICES bound one GPU per rank
  auto over = select_device(8, 8);
  REQUIRE_FALSE(over.ok());
  CHECK_THAT(over.error().message(), Catch::Contains("local rank 8") && Catch::Contains("8 devices"));
  REQUIRE_FALSE(select_device(0, 0).ok());
}
