// Launcher detection decides "threads" versus "mpi" without touching MPI;
// the local rank picks a rank's GPU.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "backends/comm/launch.h"

using namespace meshtrain;

namespace {
EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("launcher detection reads mpirun, PMI and srun variables", "[comm]") {
  auto plain = detect_launch(fake({{"SLURM_NTASKS", "8"}}));  // an sbatch script, not a step
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->has_value());

  auto ompi = detect_launch(fake({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"},
                                  {"SLURM_STEP_NUM_TASKS", "9"}, {"SLURM_PROCID", "0"}}));
  REQUIRE(ompi.ok());
  REQUIRE(ompi->has_value());
  CHECK((*ompi)->launcher == "mpirun");
  CHECK((*ompi)->world_size == 4);
  CHECK((*ompi)->rank == 2);

  auto srun = detect_launch(fake({{"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_PROCID", "15"}}));
  REQUIRE(srun.ok());
  REQUIRE(srun->has_value());
  CHECK((*srun)->launcher == "srun");
  CHECK((*srun)->rank == 15);

  auto pmi = detect_launch(fake({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}));
  REQUIRE(pmi.ok());
  CHECK((*pmi)->launcher == "pmi");

  auto bad = detect_launch(fake({{"PMI_SIZE", "two"}, {"PMI_RANK", "1"}}));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() == "environment variable PMI_SIZE=two is not a non-negative integer");
  auto out_of_range = detect_launch(fake({{"PMI_SIZE", "2"}, {"PMI_RANK", "2"}}));
  REQUIRE_FALSE(out_of_range.ok());
}

TEST_CASE("local rank comes from Open MPI, then Slurm, then LOCAL_RANK", "[comm]") {
  auto r = local_rank_from_env(fake({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "5"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(3));
  r = local_rank_from_env(fake({{"SLURM_LOCALID", "5"}, {"LOCAL_RANK", "1"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(5));
  r = local_rank_from_env(fake({{"LOCAL_RANK", "1"}}));
  REQUIRE(r.ok());
  CHECK(*r == std::optional<int>(1));
  r = local_rank_from_env(fake({}));
  REQUIRE(r.ok());
  CHECK_FALSE(r->has_value());
}

TEST_CASE("malformed local ranks are refused with the variable named", "[comm]") {
  for (const char* bad : {"", "x", "-1", "2a", " 1"}) {
    auto r = local_rank_from_env(fake({{"SLURM_LOCALID", bad}}));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains("SLURM_LOCALID"));
  }
}
