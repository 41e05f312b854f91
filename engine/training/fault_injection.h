// Faults injected into a real run (`meshtrain train --fault-inject`), so
// that straggler reports, hang and death detection and checkpoint safety run
// in CI:
//
//   RANK:slow:STEP[:FACTOR]  from step STEP on, the rank computes FACTOR (default 4)
//                            times as long: before each communication op it
//                            sleeps FACTOR-1 times what it computed since the previous one
//   RANK:hang:STEP           at its first communication op of step STEP the rank
//                            stops answering: it sleeps for `hang_for` (3x the
//                            communication timeout and a second, so its peers give
//                            up first), then goes on and fails with them
//   RANK:exit:STEP           at its first communication op of step STEP the rank dies:
//                            a process kills itself (SIGKILL, as kill -9 or a lost
//                            node would); a rank thread stops without a word (its
//                            peers see a rank that returned without joining)
//   RANK:signal:STEP:SIG     at that op the rank raises SIG (SEGV, BUS, FPE, ILL, ABRT
//                            or KILL): a crash, which takes the whole process down,
//                            rank threads and all, as a real one would (no core file)
//   RANK:throw:STEP          at that op the rank throws an exception nothing in the
//                            engine catches (a bug's): the trainer's last resort
//
// A fault must be one the run can see: a hang on a run of one rank has no
// peer to wait for it (it would sleep, then finish normally), a fault at a
// step the run never reaches never fires, and a hang and an exit of one rank
// at one step contradict each other: check_faults refuses each up front.
// A rank that dies or hangs ends the run with an error naming the ranks and
// the step, whatever the launch mode: a rank thread's death or hang, collected
// in RankLosses (its peers only see a rank that returned without joining or
// stopped answering); a process's SIGKILL, which mpirun reports and the
// survivors' last words (core/last_words.h) place; a crash's signal, which the
// crashing rank's last words name; a hung process's own error, after its
// peers have given up on it.
//
// The faults apply inside StepTimer's step window (engine/training/step_timing.h),
// whose communication hook calls before_communication.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

struct Fault {
  enum class Kind { slow, hang, exit, signal, throw_ };
  Kind kind = Kind::slow;
  int rank = 0;
  std::int64_t step = 1;
  double factor = 4;  // slow only
  int signal = 0;     // signal only
};

Result<Fault> parse_fault(const std::string& spec);
// "0:exit:2": the spec that parse_fault reads, for messages.
std::string fault_spec(const Fault& f);

// Refuses faults this run could not show (see the top of this file): the
// world has `world_size` ranks and the run ends after step `last_step`.
Status check_faults(const std::vector<Fault>& faults, int world_size, std::int64_t last_step);

// How the rank threads of one process failed: the ranks that died by an
// injected exit or stopped answering by an injected hang, and the first step
// in which any rank failed. A run of rank
// threads keeps the first error recorded (the root cause, often a peer's
// timeout, raised below the step loop); this adds what it cannot know: every
// rank lost, and the step.
class RankLosses {
 public:
  // `message`: the dead rank's own error (what the run reports when it came first).
  void record_death(int rank, std::int64_t step, std::string message);
  // The rank stopped answering at `step` (its peers will time out waiting for it).
  void record_hang(int rank, std::int64_t step);
  void record_failure(std::int64_t step);
  // `status` as it is when nothing was recorded (or it succeeded); else an
  // error naming each lost rank and the step against the run's `steps`.
  Status summarize(Status status, std::int64_t steps) const;

 private:
  mutable std::mutex mu_;
  struct Loss {
    std::int64_t step = 0;
    bool hung = false;  // else died
  };
  std::map<int, Loss> lost_;  // by rank
  std::vector<std::string> messages_;  // the dead ranks' errors
  std::int64_t failed_step_ = 0;      // 0: no rank failed in a step
};

// Thrown by a rank thread's injected exit; train_rank catches it and ends
// the rank with an error naming it and the step.
struct InjectedExit : std::exception {
  const char* what() const noexcept override { return "fault injected: this rank exits"; }
};

class FaultInjector {
 public:
  // The faults of `rank`; `process`: ranks are processes (an exit kills this
  // one); `losses` (may be null) records a hang as it begins.
  FaultInjector(const std::vector<Fault>& faults, int rank, bool process, std::chrono::milliseconds hang_for,
                RankLosses* losses = nullptr);
  bool empty() const { return faults_.empty(); }
  void begin_step(std::int64_t step) { step_ = step; }
  // Before a communication op; `compute_s` computed since the previous one.
  void before_communication(double compute_s);

 private:
  std::vector<Fault> faults_;
  int rank_;
  bool process_;
  std::chrono::milliseconds hang_for_;
  RankLosses* losses_;
  std::int64_t step_ = 0;
  std::int64_t fired_step_ = -1;  // hang and exit fire once, at the step's first op
};

}  // namespace meshtrain
