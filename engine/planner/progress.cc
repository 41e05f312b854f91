#include "engine/planner/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace meshtrain::planner {

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0) {}

void ProgressLine::set_phase(const char* phase, std::int64_t total) {
  {
    std::lock_guard lock(draw_);
    phase_ = phase;
    phase_start_ = std::chrono::steady_clock::now();
  }
  done_ = 0;
  total_ = total;
  update(true);
}

void ProgressLine::offer_best(double iteration_s) {
  double best = best_.load();
  while ((best == 0 || iteration_s < best) && !best_.compare_exchange_weak(best, iteration_s)) {
  }
}

std::string ProgressLine::text() const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_start_).count();
  const std::int64_t done = done_, total = total_;
  std::string eta = "?";
  if (done > 0 && total >= done) eta = fmt::format("{:.0f} s", elapsed / static_cast<double>(done) * (total - done));
  const double best = best_;
  return fmt::format("plan: {} {}/{} | seen {} pruned {} estimated {} simulated {} | best {} | ETA {}", phase_, done,
                     total, seen_.load(), pruned_.load(), estimated_.load(), simulated_.load(),
                     best > 0 ? fmt::format("{:.3f} s", best) : std::string("-"), eta);
}

void ProgressLine::update(bool force) {
  if (!enabled_) return;
  std::unique_lock lock(draw_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread is drawing it
  const auto now = std::chrono::steady_clock::now();
  const auto interval = terminal_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(10000);
  if (!force && now - last_draw_ < interval) return;
  last_draw_ = now;
  if (terminal_)
    std::fprintf(stderr, "\r%-110s", text().c_str());
  else
    std::fprintf(stderr, "%s\n", text().c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::finish() {
  if (!enabled_) return;
  std::lock_guard lock(draw_);
  if (!drawn_) return;
  std::fprintf(stderr, terminal_ ? "\r%-110s\n" : "%s\n", text().c_str());
  drawn_ = false;
}

}  // namespace meshtrain::planner
