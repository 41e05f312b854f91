// Issue 29, class 2: a run that lost a rank exits non-zero and says which
// ranks and at which step, whatever the launch mode; a fault the run could not
// show is refused before training. Before: `--fault-inject 0:exit:2` on one
// rank, or every rank exiting, ended with status 0 after a third of the steps,
// and a hang on a run of one rank slept and then finished normally.
#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

TEST_CASE("a rank thread that dies fails the run, naming the ranks and the step", "[reliability][rank_loss]") {
  const std::string t = tiny_train() + " --steps 6";
  expect_refusal(t + " --fault-inject 0:exit:2",
                 "rank 0 died at step 2 of 6 (--fault-inject), so the run did not complete its steps");
  expect_refusal(t + " --dp 2 --fault-inject 1:exit:3",
                 "the run lost a rank (rank 1 at step 3, by --fault-inject) and stopped at step 3 of 6");
  expect_refusal(t + " --dp 2 --fault-inject 0:exit:2 --fault-inject 1:exit:2",
                 "the run lost 2 ranks (rank 0 at step 2, rank 1 at step 2, by --fault-inject)");
  // Its peers fail too (a rank that returned without joining), but the run names the death, not their echo.
  const MeshtrainRun r = run_meshtrain(t + " --tp 2 --pp 2 --fault-inject 3:exit:2");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("the run lost a rank (rank 3 at step 2, by --fault-inject)"));
  CHECK_THAT(r.out, !Catch::Contains("returned without joining"));
}

TEST_CASE("a rank that stops answering fails the run, naming it and its step", "[reliability][rank_loss]") {
  const std::string t = tiny_train() + " --steps 4 --comm-timeout 1";
  // The hung rank itself is named, not only through its peer's timeout (which the message keeps as the first error).
  expect_refusal(t + " --dp 2 --fault-inject 1:hang:2",
                 "the run lost a rank (rank 1 stopped answering at step 2, by --fault-inject) and stopped at step 2 of "
                 "4, so it did not complete its steps; first error: ");
  expect_refusal(t + " --dp 2 --fault-inject 1:hang:2", "still waiting for rank 1");
  // Under pipeline parallelism too, and with another rank dying at the same time.
  expect_refusal(t + " --pp 2 --fault-inject 0:hang:3", "(rank 0 stopped answering at step 3, by --fault-inject)");
  expect_refusal(t + " --dp 4 --fault-inject 1:hang:2 --fault-inject 3:exit:2",
                 "the run lost 2 ranks (rank 1 stopped answering at step 2, rank 3 at step 2, by --fault-inject)");
}

TEST_CASE("a fault the run could not show is refused up front", "[reliability][rank_loss]") {
  const std::string t = tiny_train() + " --steps 3";
  expect_refusal(t + " --fault-inject 0:hang:2",
                 "--fault-inject 0:hang:2: this run has one rank, so no peer waits for it and nothing can see it hang");
  expect_refusal(t + " --dp 2 --fault-inject 1:exit:9",
                 "--fault-inject 1:exit:9: step 9 is never reached, the run ends after step 3");
  expect_refusal(t + " --dp 2 --fault-inject 1:exit:2 --fault-inject 1:hang:3",
                 "--fault-inject 1:exit:2 and 1:hang:3: rank 1 can stop only once");
  expect_refusal(t + " --dp 2 --fault-inject 0:slow:1:2 --fault-inject 0:slow:2:3", "rank 0 is slowed twice");
}

TEST_CASE("under MPI a lost rank ends the job non-zero, a hang of one process is refused", "[reliability][rank_loss][mpi]") {
  const std::string mpirun = std::string(MESHTRAIN_MPIRUN) + " ";
  const std::string exe = std::string(MESHTRAIN_EXE) + " " + tiny_train();
  // The dying process SIGKILLs itself, as a lost node would; it says so first, and mpirun names it.
  const MeshtrainRun died = run_shell(mpirun + "2 " + exe + " --steps 6 --dp 2 --fault-inject 1:exit:2");
  INFO(died.out);
  CHECK(died.status != 0);
  CHECK_THAT(died.out, Catch::Contains("fault injected: rank 1 dies at step 2"));
  const MeshtrainRun alone = run_shell(mpirun + "1 " + exe + " --steps 4 --fault-inject 0:hang:2");
  INFO(alone.out);
  CHECK(alone.status != 0);
  CHECK_THAT(alone.out, Catch::Contains("this run has one rank, so no peer waits for it"));
  // A hung process: its peer gives up at that step and names the rank it waited for; the job ends non-zero.
  const MeshtrainRun hung = run_shell(mpirun + "2 " + exe + " --steps 4 --dp 2 --comm-timeout 1 --fault-inject 1:hang:2");
  INFO(hung.out);
  CHECK(hung.status != 0);
  CHECK_THAT(hung.out, Catch::Contains("fault injected: rank 1 stops answering at step 2"));
  CHECK_THAT(hung.out, Catch::Contains("step 2 of 4: rank 0: ") || Catch::Contains("step 2: "));
  CHECK_THAT(hung.out, Catch::Contains("still waiting for rank 1"));
}
