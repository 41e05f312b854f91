// MPI start-up and shutdown for a job of processes, whichever backend runs in
// them: the cpu backend's "mpi" communicator and the cuda backend's NCCL
// bootstrap (id_channel.h) both need MPI initialised first.
//
// A plain run (no launcher variables, launch.h) never touches MPI, so the
// engine picks the "threads" communicator without MPI_Init; under a launcher
// it creates one MpiEnvironment in main, then the communicators.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace meshtrain {

// Initialises MPI at most once per process and finalises it on destruction.
// Thread level MPI_THREAD_SERIALIZED: one thread calls MPI at a time, but not
// necessarily the main thread (the cpu backend may issue communication from a
// stream worker). If MPI is already initialised the environment adopts it and
// leaves finalising to its owner. Destroy every communicator over MPI first.
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

// MPI's text for an error code (MPI_Error_string), for the Errors that name
// a failed MPI call.
std::string mpi_error_text(int code);

}  // namespace meshtrain
