#include "backends/cpu/comm/mpi_environment.h"

#include <mpi.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

namespace meshtrain {

namespace {

Result<int> parse_int(const char* name, const char* text) {
  int value = 0;
  std::string_view s(text);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0)
    return make_error("environment variable {}={} is not a non-negative integer", name, text);
  return value;
}

}  // namespace

Result<std::optional<LaunchInfo>> detect_launch(const EnvLookup& getenv) {
  const EnvLookup get = getenv ? getenv : EnvLookup([](const char* n) { return std::getenv(n); });
  struct Source {
    const char* launcher;
    const char* size;
    const char* rank;
  };
  for (const Source& s : {Source{"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                          Source{"pmi", "PMI_SIZE", "PMI_RANK"},
                          Source{"srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}}) {
    const char* size = get(s.size);
    if (size == nullptr) continue;
    const char* rank = get(s.rank);
    if (rank == nullptr) return make_error("{} is set but {} is not", s.size, s.rank);
    MT_ASSIGN(int world, parse_int(s.size, size));
    MT_ASSIGN(int r, parse_int(s.rank, rank));
    if (world < 1 || r >= world)
      return make_error("{}={} and {}={} do not describe a rank of a world", s.size, size, s.rank, rank);
    return std::optional<LaunchInfo>(LaunchInfo{s.launcher, world, r});
  }
  return std::optional<LaunchInfo>();
}

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

}  // namespace meshtrain
