#include "simulator/event_queue.h"

#include <cmath>

namespace meshtrain::sim {

Time from_seconds(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<Time>(std::ceil(seconds * 1e12));
}

void Simulator::schedule(Time at, EventHandler* handler, uint64_t tag) {
  if (at < now_) at = now_;
  queue_.push(Event{at, next_id_++, handler, tag});
}

uint64_t Simulator::run() {
  uint64_t n = 0;
  while (!queue_.empty()) {
    Event e = queue_.top();
    queue_.pop();
    now_ = e.time;
    e.handler->on_event(*this, e.tag);
    ++n;
  }
  processed_ += n;
  return n;
}

uint64_t Simulator::run_until(Time until) {
  uint64_t n = 0;
  while (!queue_.empty() && queue_.top().time <= until) {
    Event e = queue_.top();
    queue_.pop();
    now_ = e.time;
    e.handler->on_event(*this, e.tag);
    ++n;
  }
  if (now_ < until) now_ = until;
  processed_ += n;
  return n;
}

}  // namespace meshtrain::sim
