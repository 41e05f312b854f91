// What the launcher (mpirun, srun) tells a process through its environment:
// its rank and the world, and its rank within the node. Both real backends
// depend on it: the engine picks the cpu backend's "threads" or "mpi"
// communicator from detect_launch, and the cuda backend picks a rank's GPU
// from local_rank_from_env. Nothing here touches MPI, so a plain run (no
// launcher variables) never initialises it.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/status.h"

namespace meshtrain {

// getenv, injectable for tests; an empty one reads the process environment.
using EnvLookup = std::function<const char*(const char*)>;

struct LaunchInfo {
  std::string launcher;  // "mpirun" (Open MPI), "pmi" (srun --mpi=pmi2, hydra) or "srun"
  int world_size = 1;
  int rank = 0;
};

// Reads the variables launchers set, first found wins: OMPI_COMM_WORLD_SIZE and
// OMPI_COMM_WORLD_RANK (Open MPI's mpirun), PMI_SIZE and PMI_RANK, then
// SLURM_STEP_NUM_TASKS and SLURM_PROCID (any srun step). SLURM_NTASKS alone
// is not enough: sbatch sets it in the batch script, which is one process.
// nullopt: not launched by them. Fails on malformed values.
Result<std::optional<LaunchInfo>> detect_launch(const EnvLookup& getenv = {});

// The first of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun), SLURM_LOCALID
// (srun) and LOCAL_RANK (torchrun-style launchers) that is set; nullopt when
// none is. Fails on a value that is not a non-negative integer.
Result<std::optional<int>> local_rank_from_env(const EnvLookup& getenv = {});

}  // namespace meshtrain
