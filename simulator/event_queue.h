// The discrete-event core: a clock and a queue of pending events.
//
// Time is an integer count of picoseconds, so adding durations never rounds
// and a run repeats bit for bit. Events are ordered by (time, insertion id):
// two events at the same instant run in the order they were scheduled, which
// makes one input give one trace.
//
// There are no globals. Each `Simulator` owns its clock and queue; several can
// live in one process (e.g. a what-if sweep that runs plans side by side).
// A Simulator is not thread-safe; use one per thread.
//
// Events carry no heap state: an event is (time, id, handler, tag). The
// handler is an object that outlives the event (the network, the executor);
// the 64-bit tag tells it which of its things the event is about. Components
// that need to "cancel" an event (a flow whose rate changed) encode a
// generation number in the tag and ignore stale ones; that keeps the queue a
// plain binary heap.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

namespace meshtrain::sim {

// Picoseconds. int64 covers ±106 days of simulated time.
using Time = int64_t;

inline constexpr Time kPicosecond = 1;
inline constexpr Time kNanosecond = 1'000;
inline constexpr Time kMicrosecond = 1'000'000;
inline constexpr Time kMillisecond = 1'000'000'000;
inline constexpr Time kSecond = 1'000'000'000'000;

// Seconds (double) -> picoseconds, rounded up so a nonzero duration never
// becomes zero (a zero-time kernel would let work reorder itself).
Time from_seconds(double seconds);
inline double to_seconds(Time t) { return static_cast<double>(t) * 1e-12; }

class Simulator;

// Something that receives events. `tag` is whatever the scheduler passed.
class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void on_event(Simulator& sim, uint64_t tag) = 0;
};

class Simulator {
 public:
  Time now() const { return now_; }

  // Schedules `handler->on_event(sim, tag)` at absolute time `at` (>= now()).
  // Scheduling in the past is an invariant violation of the caller and is
  // clamped to now() so the clock never runs backwards.
  void schedule(Time at, EventHandler* handler, uint64_t tag);
  void schedule_after(Time delay, EventHandler* handler, uint64_t tag) {
    schedule(now_ + delay, handler, tag);
  }

  // Runs events until the queue is empty. Returns the number processed.
  uint64_t run();
  // Runs events with time <= `until`, then sets the clock to `until`.
  uint64_t run_until(Time until);

  bool empty() const { return queue_.empty(); }
  uint64_t events_processed() const { return processed_; }

 private:
  struct Event {
    Time time;
    uint64_t id;  // insertion order: the tie-break that makes runs repeat
    EventHandler* handler;
    uint64_t tag;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.id > b.id;
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  Time now_ = 0;
  uint64_t next_id_ = 0;
  uint64_t processed_ = 0;
};

}  // namespace meshtrain::sim
