// Issue 31: a rank that dies under mpirun says which rank, in which step and
// what was last checkpointed, and the survivors say where they were when
// mpirun ended them. Before, a crash left only Open MPI's "exited on signal
// 11" and backtrace (no step, no checkpoint), a SIGKILL only mpirun's line,
// an uncaught exception an "internal error" naming neither rank nor step, and
// the survivor, ended by mpirun's SIGTERM then SIGKILL, said nothing.
//
// mpirun ends the survivors one second after a death (SIGTERM, then SIGKILL
// one second later); the survivor waits for the dead rank from its step's
// first collective on, milliseconds after the step starts, so it is nearly
// always waiting by then. A loaded machine may hold it back past that
// second: its line then places it without a peer, so a test asks the peer
// only of a survivor that says it was waiting (survivor_says).
#include <signal.h>

#include <nlohmann/json.hpp>

#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

namespace {

// Six steps under mpirun -np 2, checkpointed every 2, with `fault`.
MeshtrainRun mpi_run(const fs::path& ckpt, const std::string& fault, const std::string& more = "") {
  return run_shell(std::string(MESHTRAIN_MPIRUN) + " 2 " + MESHTRAIN_EXE + " " + tiny_train() +
                   " --steps 6 --dp 2 --checkpoint " + ckpt.string() + " --checkpoint-every 2 --fault-inject " + fault +
                   more);
}

std::int64_t manifest_step(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in).at("step").get<std::int64_t>();
}

// What every line about a run stopped in step 3 says of its checkpoint.
std::string step2_note(const fs::path& ckpt) {
  return "the last checkpoint in '" + ckpt.string() + "' is of step 2: continue it with --resume (from step 3)";
}

// The survivor `rank`'s line, ended by mpirun's SIGTERM: where it stopped and the checkpoint, and
// the rank it was waiting for, `dead`, if it was waiting.
void survivor_says(const std::string& out, int rank, int dead, const fs::path& ckpt) {
  const std::string head = "meshtrain: rank " + std::to_string(rank) + " got SIGTERM ";
  const std::size_t at = out.find(head);
  REQUIRE(at != std::string::npos);
  const std::string line = out.substr(at, out.find('\n', at) - at);
  INFO(line);
  CHECK_THAT(line, Catch::Contains(step2_note(ckpt)));
  CHECK_THAT(line, Catch::Contains(" step 3 of 6") || Catch::Contains(" after step 2 of 6"));
  if (line.find("while waiting") != std::string::npos)
    CHECK_THAT(line, Catch::Contains(" s for rank " + std::to_string(dead) + ";"));
}

}  // namespace

TEST_CASE("under mpirun a rank that crashes names itself, its signal, its step and the checkpoint",
          "[reliability][rank_loss][crash][mpi]") {
  const fs::path ckpt = scratch("crash-segv");
  const MeshtrainRun r = mpi_run(ckpt, "1:signal:3:SEGV");
  INFO(r.out);
  CHECK(r.status == 128 + SIGSEGV);  // mpirun passes the signal on
  CHECK_THAT(r.out, Catch::Contains("meshtrain: rank 1 died of SIGSEGV in step 3 of 6; " + step2_note(ckpt)));
  CHECK_THAT(r.out, Catch::Contains("exited on signal 11"));
  // The survivor, ended by mpirun, names the rank it was waiting for.
  survivor_says(r.out, 0, 1, ckpt);
  CHECK(manifest_step(ckpt) == 2);
}

TEST_CASE("under mpirun the leader aborting is named by itself and by its peer", "[reliability][rank_loss][crash][mpi]") {
  const fs::path ckpt = scratch("crash-abrt");
  const MeshtrainRun r = mpi_run(ckpt, "0:signal:3:ABRT");
  INFO(r.out);
  CHECK(r.status == 128 + SIGABRT);
  CHECK_THAT(r.out, Catch::Contains("meshtrain: rank 0 died of SIGABRT in step 3 of 6; " + step2_note(ckpt)));
  CHECK_THAT(r.out, Catch::Contains("exited on signal 6"));
  survivor_says(r.out, 1, 0, ckpt);
}

TEST_CASE("under mpirun a SIGKILLed rank is named by mpirun and placed by the survivor, and the run resumes",
          "[reliability][rank_loss][crash][mpi]") {
  // SIGKILL cannot be caught: the dying rank says nothing of its own (the
  // line "fault injected: ..." is the injection's), mpirun names the rank and
  // the survivor the step, the rank it waited for and the checkpoint.
  const fs::path ckpt = scratch("crash-kill");
  const MeshtrainRun r = mpi_run(ckpt, "1:exit:3");
  INFO(r.out);
  CHECK(r.status == 128 + SIGKILL);
  CHECK_THAT(r.out, Catch::Contains("process rank 1 with PID") && Catch::Contains("exited on signal 9 (Killed)"));
  CHECK_THAT(r.out, !Catch::Contains("rank 1 died of"));
  survivor_says(r.out, 0, 1, ckpt);
  // Nothing checkpointed is lost: --resume continues from step 3 (the dead rank's stale lock does not block it).
  const MeshtrainRun resumed = run_shell(std::string(MESHTRAIN_MPIRUN) + " 2 " + MESHTRAIN_EXE + " " + tiny_train() +
                                         " --steps 6 --dp 2 --checkpoint " + ckpt.string() + " --resume");
  INFO(resumed.out);
  CHECK(resumed.status == 0);
  CHECK(manifest_step(ckpt) == 6);
}

TEST_CASE("under mpirun an exception nothing caught names the rank, the step and the checkpoint",
          "[reliability][rank_loss][crash][mpi]") {
  const fs::path ckpt = scratch("crash-throw");
  const MeshtrainRun r = mpi_run(ckpt, "1:throw:3");
  INFO(r.out);
  CHECK(r.status == 1);  // MPI_Abort's error code
  CHECK_THAT(r.out, Catch::Contains("meshtrain: rank 1: step 3: uncaught exception (please report it): fault injected: "
                                    "rank 1 throws at step 3; the last checkpoint in '" + ckpt.string() +
                                    "' is of step 2"));
}

TEST_CASE("a rank thread that crashes takes the process down, naming itself and its step", "[reliability][rank_loss][crash]") {
  const MeshtrainRun r = run_meshtrain(tiny_train() + " --steps 6 --dp 2 --fault-inject 1:signal:3:SEGV");
  INFO(r.out);
  CHECK(r.status == 128 + SIGSEGV);
  CHECK_THAT(r.out, Catch::Contains("meshtrain: rank 1 died of SIGSEGV in step 3 of 6; no --checkpoint was given, so "
                                    "nothing was saved"));
  const MeshtrainRun thrown = run_meshtrain(tiny_train() + " --steps 6 --dp 2 --fault-inject 1:throw:2");
  INFO(thrown.out);
  CHECK(thrown.status == 1);
  CHECK_THAT(thrown.out, Catch::Contains("rank 1: step 2: uncaught exception (please report it): fault injected: rank 1 "
                                         "throws at step 2; no --checkpoint was given"));
}

TEST_CASE("a crash fault names a signal it can raise, once per rank", "[reliability][rank_loss][crash]") {
  const std::string t = tiny_train() + " --steps 3 --dp 2";
  expect_refusal(t + " --fault-inject 1:signal:2", "signal needs the signal to raise: RANK:signal:STEP:SIG");
  expect_refusal(t + " --fault-inject 1:signal:2:TERM",
                 "'TERM' is not a signal a fault raises: SEGV, BUS, FPE, ILL, ABRT or KILL");
  expect_refusal(t + " --fault-inject 1:throw:2:3", "only slow takes a factor");
  expect_refusal(t + " --fault-inject 1:signal:2:SIGBUS --fault-inject 1:throw:3",
                 "--fault-inject 1:signal:2:BUS and 1:throw:3: rank 1 can stop only once (it dies at step 2)");
}
