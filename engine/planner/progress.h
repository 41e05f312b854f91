// The planner's progress line on stderr: candidates seen, pruned by memory,
// estimated, simulated, the best iteration time so far and the time left.
// Counters are atomics that any worker thread bumps; `update` redraws the
// line at most five times a second, from whichever thread calls it. On a
// terminal the line is rewritten in place ('\r'); into a file or a pipe (a
// log) each update is a line of its own, at most one every 10 s and one per
// phase, and never a '\r'.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace meshtrain::planner {

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine() { finish(); }

  void set_phase(const char* phase, std::int64_t total);  // starts a tier: its name and work items
  void set_seen(std::int64_t n) { seen_ = n; }
  void add_pruned(std::int64_t n) { pruned_ += n; }
  void add_estimated(std::int64_t n) { estimated_ += n; }
  void add_simulated(std::int64_t n) { simulated_ += n; }
  void add_done(std::int64_t n) { done_ += n; }  // work items of the current phase
  void offer_best(double iteration_s);
  void update(bool force = false);
  void finish();  // ends the line (a newline) if one was drawn

 private:
  std::string text() const;

  const bool enabled_;
  const bool terminal_;  // stderr is a terminal: redraw in place
  std::atomic<std::int64_t> seen_{0}, pruned_{0}, estimated_{0}, simulated_{0}, done_{0}, total_{0};
  std::atomic<double> best_{0};
  std::mutex draw_;  // guards phase_, phase_start_, last_draw_, drawn_ and the terminal
  const char* phase_ = "";
  std::chrono::steady_clock::time_point phase_start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace meshtrain::planner
