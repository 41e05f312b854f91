// The bookkeeping of the NCCL watchdog: which communication ops are still in
// flight, since when, and whether one has failed or run past its timeout.
// Free of CUDA and NCCL (the caller supplies "is it done" predicates and the
// communicators' async-error query), so it is tested with fakes and a fake
// clock; nccl_comm.cc runs it on a thread.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::cuda {

using Clock = std::chrono::steady_clock;

class Watchdog {
 public:
  // An async-error query: the failure message of group `group`'s communicator,
  // nullopt while it is healthy.
  using AsyncError = std::function<std::optional<std::string>(int group)>;

  Watchdog(int rank, std::chrono::milliseconds timeout) : rank_(rank), timeout_(timeout) {}

  // An op issued at `issued` on `group` (`op` says what, e.g. "all_reduce of
  // 4096 f32", `peers` whom it waits for); finished once done() is true.
  void track(std::string op, int group, std::string peers, Clock::time_point issued,
             std::function<bool()> done);
  // Drops finished ops, then reports the first failure: a communicator of an
  // op in flight with an async error, else the oldest op past the timeout.
  std::optional<Error> poll(Clock::time_point now, const AsyncError& async_error);
  std::size_t in_flight() const;

 private:
  struct Op {
    std::string op;
    int group;
    std::string peers;
    Clock::time_point issued;
    std::function<bool()> done;
  };
  const int rank_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;  // guards ops_: tracked by the issuing thread, polled by the watchdog
  std::vector<Op> ops_;    // in issue order
};

}  // namespace meshtrain::cuda
