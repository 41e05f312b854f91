// DeviceClockBackend: a BackendWrapper for tests that makes the backend it
// wraps (the cpu backend) look like an asynchronous device to whoever waits
// on it or times it, and counts the waits.
//
// Device timing: with a clock, timed_event gives valid events, and the i-th
// (0-based) happens at device time clock(i) seconds; seconds_between is the
// difference. The cpu backend has no device time, so the test chooses it.
//
// Waits: read and synchronize block, as on the cuda backend. Like a device
// that runs its work in issue order, a blocking call leaves every timing
// event issued before it complete; seconds_between blocks only when its end
// event was issued after the last blocking call (on the cuda backend its
// cudaEventSynchronize would wait for the device). blocking() counts the
// calls that block.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backends/backend_wrapper.h"

namespace meshtrain::testing {

class DeviceClockBackend final : public meshtrain::BackendWrapper {
 public:
  // Null clock: no device timing (timed_event invalid, as the cpu backend).
  explicit DeviceClockBackend(Backend& target, std::function<double(std::int64_t)> clock = {})
      : BackendWrapper(target), clock_(std::move(clock)) {}

  Status read(const Tensor& src, std::span<float> host) override {
    ++reads_;
    block();
    return target().read(src, host);
  }
  Status synchronize() override {
    ++synchronizes_;
    block();
    return target().synchronize();
  }
  Event timed_event(Stream s) override {
    if (!clock_) return target().timed_event(s);
    times_.push_back(clock_(static_cast<std::int64_t>(times_.size())));
    return Event{static_cast<std::int64_t>(times_.size()) - 1};
  }
  Result<double> seconds_between(Event start, Event end) override {
    if (!clock_) return target().seconds_between(start, end);
    for (const Event e : {start, end})
      if (!e.valid() || e.id >= static_cast<std::int64_t>(times_.size()))
        return make_error("seconds_between: event {} was not issued here", e.id);
    ++timings_read_;
    if (end.id >= complete_) ++blocking_;  // the device has not necessarily reached it
    return times_[static_cast<std::size_t>(end.id)] - times_[static_cast<std::size_t>(start.id)];
  }

  std::int64_t blocking() const { return blocking_; }  // reads, synchronizes and waiting seconds_between
  std::int64_t reads() const { return reads_; }
  std::int64_t synchronizes() const { return synchronizes_; }
  std::int64_t timings_read() const { return timings_read_; }  // seconds_between calls
  std::int64_t timed_events() const { return static_cast<std::int64_t>(times_.size()); }

 private:
  void block() {
    ++blocking_;
    complete_ = static_cast<std::int64_t>(times_.size());
  }

  std::function<double(std::int64_t)> clock_;
  std::vector<double> times_;   // by event id
  std::int64_t complete_ = 0;   // events [0, complete_) have happened
  std::int64_t blocking_ = 0, reads_ = 0, synchronizes_ = 0, timings_read_ = 0;
};

}  // namespace meshtrain::testing
