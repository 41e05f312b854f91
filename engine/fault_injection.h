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
//
// The faults apply inside StepTimer's step window (engine/step_timing.h),
// whose communication hook calls before_communication.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

struct Fault {
  enum class Kind { slow, hang, exit };
  Kind kind = Kind::slow;
  int rank = 0;
  std::int64_t step = 1;
  double factor = 4;  // slow only
};

Result<Fault> parse_fault(const std::string& spec);

// Thrown by a rank thread's injected exit; train_rank catches it and ends
// the rank quietly.
struct InjectedExit : std::exception {
  const char* what() const noexcept override { return "fault injected: this rank exits"; }
};

class FaultInjector {
 public:
  // The faults of `rank`; `process`: ranks are processes (an exit kills this one).
  FaultInjector(const std::vector<Fault>& faults, int rank, bool process, std::chrono::milliseconds hang_for);
  bool empty() const { return faults_.empty(); }
  void begin_step(std::int64_t step) { step_ = step; }
  // Before a communication op; `compute_s` computed since the previous one.
  void before_communication(double compute_s);

 private:
  std::vector<Fault> faults_;
  int rank_;
  bool process_;
  std::chrono::milliseconds hang_for_;
  std::int64_t step_ = 0;
  std::int64_t fired_step_ = -1;  // hang and exit fire once, at the step's first op
};

}  // namespace meshtrain
