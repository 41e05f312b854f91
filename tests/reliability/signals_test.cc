// SIGTERM and SIGINT (Slurm's preemption, a terminal's Ctrl-C) end a run
// gracefully: every rank stops after the same step, a checkpoint of that step
// is written, and the process exits with 128 + the signal. Before, the run
// died at once, losing everything since the last checkpoint.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/reliability/cli.h"

extern char** environ;

using namespace meshtrain::testing;

namespace {

// A meshtrain (or mpirun) started in the background, its output in a file.
struct Background {
  pid_t pid = -1;
  fs::path log;
  std::string output() const {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
};

Background start(const std::string& command, const std::string& name) {
  Background b;
  b.log = scratch(name + ".log");
  const std::string line = "exec " + command + " >" + b.log.string() + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
  REQUIRE(posix_spawn(&b.pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) == 0);
  return b;
}

// Lines in a file (metrics: one per step).
int lines_of(const fs::path& p) {
  std::ifstream in(p);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// Waits up to `seconds` for `ready`; false on timeout.
template <class F>
bool wait_for(F ready, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The exit status of `b` (128 + signal when killed); kills it and fails after `seconds`.
int wait_exit(const Background& b, double seconds) {
  int status = 0;
  const bool exited = wait_for([&] { return waitpid(b.pid, &status, WNOHANG) == b.pid; }, seconds);
  if (!exited) {
    kill(b.pid, SIGKILL);
    waitpid(b.pid, &status, 0);
    FAIL("the run did not end within " << seconds << " s of the signal (a hang); output:\n" << b.output());
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::int64_t manifest_step(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in).at("step").get<std::int64_t>();
}

// The pid the checkpoint lock records ("pid N on host H"): rank 0's process.
pid_t lock_holder(const fs::path& dir) {
  std::ifstream in(dir / "meshtrain.lock");
  std::string word;
  pid_t pid = -1;
  in >> word >> pid;
  return pid;
}

}  // namespace

TEST_CASE("SIGTERM and SIGINT stop ranks as threads after one step, checkpointed", "[reliability][signals]") {
  for (int signal : {SIGTERM, SIGINT}) {
    const std::string name = signal == SIGTERM ? "SIGTERM" : "SIGINT";
    INFO(name);
    const fs::path dir = scratch("signal-ckpt-" + name), metrics = scratch("signal-" + name + ".jsonl");
    // Two data-parallel rank threads: they must agree on the step to stop after.
    Background run = start(std::string(MESHTRAIN_EXE) + " " + tiny_train() + " --dp 2 --steps 1000000 --checkpoint " +
                               dir.string() + " --metrics " + metrics.string(),
                           "signal-" + name);
    REQUIRE(wait_for([&] { return lines_of(metrics) >= 3; }, 60));
    REQUIRE(kill(run.pid, signal) == 0);
    const int status = wait_exit(run, 60);
    const std::string out = run.output();
    INFO(out);
    CHECK(status == 128 + signal);
    const std::int64_t step = manifest_step(dir);
    CHECK(step == lines_of(metrics));  // the last step run is the one checkpointed
    CHECK_THAT(out, Catch::Contains("stopped by " + name + " after step " + std::to_string(step) + " of 1000000; the last checkpoint in '" +
                                    dir.string() + "' is of step " + std::to_string(step) + ": continue it with --resume"));
    // And it continues from there.
    const MeshtrainRun resumed = run_meshtrain(tiny_train() + " --dp 2 --steps " + std::to_string(step + 2) +
                                               " --resume --checkpoint " + dir.string());
    INFO(resumed.out);
    CHECK(resumed.status == 0);
    CHECK(manifest_step(dir) == step + 2);
  }
}

TEST_CASE("without --checkpoint a signal still ends the run cleanly, saying nothing was saved", "[reliability][signals]") {
  const fs::path metrics = scratch("signal-nockpt.jsonl");
  Background run = start(std::string(MESHTRAIN_EXE) + " " + tiny_train() + " --steps 1000000 --metrics " + metrics.string(),
                         "signal-nockpt");
  REQUIRE(wait_for([&] { return lines_of(metrics) >= 2; }, 60));
  REQUIRE(kill(run.pid, SIGTERM) == 0);
  CHECK(wait_exit(run, 60) == 128 + SIGTERM);
  CHECK_THAT(run.output(), Catch::Contains("no --checkpoint was given, so nothing was saved"));
}

TEST_CASE("under MPI a signal to one rank stops every rank after the same step", "[reliability][signals][mpi]") {
  const fs::path dir = scratch("signal-mpi-ckpt"), metrics = scratch("signal-mpi.jsonl");
  Background run = start(std::string(MESHTRAIN_MPIRUN) + " 2 " + std::string(MESHTRAIN_EXE) + " " + tiny_train() +
                             " --dp 2 --steps 1000000 --checkpoint " + dir.string() + " --metrics " + metrics.string(),
                         "signal-mpi");
  REQUIRE(wait_for([&] { return lines_of(metrics) >= 3; }, 120));
  // Only rank 0's process (the holder of the checkpoint lock) gets the signal;
  // rank 1 learns of it through the ranks' vote after each step.
  const pid_t rank0 = lock_holder(dir);
  REQUIRE(rank0 > 0);
  REQUIRE(kill(rank0, SIGTERM) == 0);
  const int status = wait_exit(run, 120);
  const std::string out = run.output();
  INFO(out);
  CHECK(status != 0);
  const std::int64_t step = manifest_step(dir);
  CHECK(step == lines_of(metrics));
  // Both ranks report the same step.
  const std::string stopped = "stopped by SIGTERM after step " + std::to_string(step) + " of 1000000";
  const auto first = out.find(stopped);
  REQUIRE(first != std::string::npos);
  CHECK(out.find(stopped, first + 1) != std::string::npos);
}
