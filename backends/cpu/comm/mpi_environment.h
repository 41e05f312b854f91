// MPI start-up and shutdown for the "mpi" communicator, and how a program
// tells whether it was launched by mpirun or srun at all.
//
// A plain run (no launcher variables) never touches MPI, so the engine picks
// the "threads" communicator without MPI_Init; under a launcher it creates one
// MpiEnvironment in main, then an MpiCommunicator.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"

namespace meshtrain {

struct LaunchInfo {
  std::string launcher;  // "mpirun" (Open MPI), "pmi" (srun --mpi=pmi2, hydra) or "srun"
  int world_size = 1;
  int rank = 0;
};

// Reads the variables launchers set, first found wins: OMPI_COMM_WORLD_SIZE and
// OMPI_COMM_WORLD_RANK (Open MPI's mpirun), PMI_SIZE and PMI_RANK, then
// SLURM_STEP_NUM_TASKS and SLURM_PROCID (any srun step). SLURM_NTASKS alone
// is not enough: sbatch sets it in the batch script, which is one process.
// nullopt: not launched by them. Fails on malformed values. `getenv` is
// injectable for tests.
using EnvLookup = std::function<const char*(const char*)>;
Result<std::optional<LaunchInfo>> detect_launch(const EnvLookup& getenv = {});

// Initialises MPI at most once per process and finalises it on destruction.
// Thread level MPI_THREAD_SERIALIZED: one thread calls MPI at a time, but not
// necessarily the main thread (the cpu backend may issue communication from a
// stream worker). If MPI is already initialised the environment adopts it and
// leaves finalising to its owner. Destroy every MpiCommunicator first.
class MpiEnvironment {
 public:
  static Result<std::unique_ptr<MpiEnvironment>> init(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }

  // A barrier of every process that waits asleep, testing for completion
  // every `poll`: a process blocked inside MPI busy-polls a core, which ranks
  // waiting while one of them measures kernels must not do.
  Status barrier_asleep(std::chrono::milliseconds poll = std::chrono::milliseconds(5)) const;

 private:
  MpiEnvironment(bool owned, int rank, int world) : owned_(owned), rank_(rank), world_(world) {}
  bool owned_;
  int rank_;
  int world_;
};

// Stops the whole job after an unrecoverable error: prints "meshtrain: <error>"
// to stderr and calls MPI_Abort(MPI_COMM_WORLD, 1), which ends every rank with
// a non-zero exit. main calls it when a run under MPI returns an error (a
// communicator timeout in particular: the peers that did not arrive may be
// blocked elsewhere and only an abort reaches them). Without MPI (or after
// MPI_Finalize) it exits the process with status 1.
[[noreturn]] void abort_job(const Error& error);

}  // namespace meshtrain
