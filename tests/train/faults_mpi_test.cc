// Faults with ranks as MPI processes (`mpirun -np 2`, as the CMake sets
// MESHTRAIN_BIN): a rank killed mid-step (SIGKILL) or frozen is named by its
// peer after --comm-timeout with the op and group, every process exits
// non-zero, and the last checkpoint resumes; a slowed rank is named.
//
// Open MPI's mpirun ends a job at once when a process dies, itself naming
// the rank ("exited on signal 9"); the test runs with
// orte_abort_on_non_zero_status 0 (Open MPI 4) so that the survivor finds
// out on its own, as it must when the launcher does not (srun, or a node
// that does not come back).
#include <catch2/catch.hpp>

#include <string>

#include "tests/run_meshtrain.h"
#include "tests/train/fault_scratch.h"

using namespace meshtrain::testing;

TEST_CASE("under mpirun a rank killed mid-step is named and the last checkpoint resumes", "[train][faults][mpi]") {
  const std::string common = checkpointed_train("kill-ckpt");
  check_fails_naming(common + " --fault-inject 1:exit:4",
                     Catch::Contains("rank 1 dies at step 4") && Catch::Contains("on group") &&
                         Catch::Contains("timed out after 2000 ms; still waiting for rank 1"));
  check_resumes(common, 3, 6);  // the checkpoint of step 2 is intact
}

TEST_CASE("under mpirun a frozen rank is named and the job ends", "[train][faults][mpi]") {
  check_fails_naming(fault_train(" --dp 2 --steps 4 --comm-timeout 2 --fault-inject 1:hang:2"),
                     Catch::Contains("rank 1 stops answering at step 2") &&
                         Catch::Contains("timed out after 2000 ms; still waiting for rank 1"));
}

TEST_CASE("under mpirun a slowed rank is named as the straggler", "[train][faults][mpi]") {
  const auto lines = metrics_of_run("mpi-slow.jsonl", " --dp 2 --steps 4 --fault-inject 1:slow:1:32");
  REQUIRE(lines.size() == 4);
  for (const auto& j : lines) {
    if (j["step"] >= 2) check_rank_1_straggles(j);
  }
}
