#include "backends/cpu/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/thread_share.h"

namespace meshtrain::cpu {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_per_rank(int ranks) { return rank_thread_share(available_cores(), ranks); }

int rank_threads(int requested, int ranks) { return requested > 0 ? requested : threads_per_rank(ranks); }

int mpi_ranks_sharing_cores() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && available_cores() < online) return 1;  // bound to cores of its own
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 1;
}

}  // namespace meshtrain::cpu
