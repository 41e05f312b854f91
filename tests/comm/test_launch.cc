// Launcher detection decides "threads" versus "mpi" without touching MPI.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "backends/cpu/comm/mpi_environment.h"

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
