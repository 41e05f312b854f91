// abort_job must stop every rank of the job with a non-zero exit. Rank 1 fails
// at once; rank 0 waits on it with a long timeout and, if it is still alive
// when that runs out, says so and exits 0. The CTest (tests/cmake/
// expect_exit.cmake) wants status 1 and rank 1's message, and fails on rank
// 0's line.
#include <chrono>
#include <cstdio>

#include "backends/comm/mpi_environment.h"
#include "backends/cpu/comm/mpi_communicator.h"

using namespace meshtrain;

int main(int argc, char** argv) {
  auto env = MpiEnvironment::init(&argc, &argv);
  if (!env.ok()) abort_job(env.error());
  CommOptions opt;
  opt.timeout = std::chrono::seconds(20);
  auto comm = MpiCommunicator::create(opt);
  if (!comm.ok()) abort_job(comm.error());
  if ((*comm)->rank() == 1) abort_job(make_error("rank 1: injected failure"));
  const Status st = (*comm)->barrier(Group{0, {0, 1}});
  std::printf("rank 0 outlived the abort (barrier: %s)\n", st.ok() ? "ok" : st.error().message().c_str());
  return 0;
}
