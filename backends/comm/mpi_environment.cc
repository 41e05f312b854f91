#include "backends/comm/mpi_environment.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace meshtrain {

Result<std::unique_ptr<MpiEnvironment>> MpiEnvironment::init(int* argc, char*** argv) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised) return make_error("MPI was already finalised in this process; it cannot start again");
  bool owned = false;
  if (!initialised) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return make_error("MPI_Init_thread failed");
    owned = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      return make_error("MPI provides thread level {} but meshtrain needs MPI_THREAD_SERIALIZED ({})",
                        provided, static_cast<int>(MPI_THREAD_SERIALIZED));
    }
  }
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return std::unique_ptr<MpiEnvironment>(new MpiEnvironment(owned, rank, world));
}

MpiEnvironment::~MpiEnvironment() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (owned_ && !finalised) MPI_Finalize();
}

Status MpiEnvironment::barrier_asleep(std::chrono::milliseconds poll) const {
  MPI_Request request;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS)
    return make_error("rank {}: MPI_Ibarrier failed", rank_);
  for (int done = 0;;) {
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return make_error("rank {}: MPI_Test on a barrier failed", rank_);
    if (done) return ok_status();
    std::this_thread::sleep_for(poll);
  }
}

void abort_job(const Error& error) {
  std::fprintf(stderr, "meshtrain: %s\n", error.message().c_str());
  std::fflush(stderr);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace meshtrain
