// The main() of a Catch2 test run under mpirun: MPI initialised first (the
// communicators and the NCCL bootstrap need it), then the tests on every
// rank, and every rank exits with the job's worst verdict, so mpirun's exit
// status fails when any rank failed.
#pragma once

#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdio>

#include "backends/comm/mpi_environment.h"

namespace meshtrain::testing {

inline int run_catch_under_mpi(int argc, char** argv) {
  auto env = MpiEnvironment::init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.error().message().c_str());
    return 1;
  }
  int failed = Catch::Session().run(argc, argv);
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace meshtrain::testing
