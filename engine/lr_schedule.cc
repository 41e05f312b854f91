#include "engine/lr_schedule.h"

#include <cassert>
#include <cmath>
#include <numbers>

namespace meshtrain {

Status validate_lr_schedule(const LrSchedule& s) {
  if (!(s.lr >= 0) || !(s.min_lr >= 0)) {
    return make_error("learning rates must be non-negative, got --lr {} and min lr {}", s.lr,
                      s.min_lr);
  }
  if (s.min_lr > s.lr) return make_error("min lr {} is above --lr {}; lower it", s.min_lr, s.lr);
  if (s.total < 1) return make_error("the schedule needs at least one step, got {}", s.total);
  if (s.warmup < 0 || s.warmup > s.total) {
    return make_error("warm-up of {} steps must be between 0 and the {} total steps", s.warmup,
                      s.total);
  }
  return ok_status();
}

double lr_at(const LrSchedule& s, int step) {
  assert(step >= 1);
  if (step <= s.warmup) return s.lr * step / s.warmup;
  if (step >= s.total) return s.min_lr;
  const double progress = static_cast<double>(step - s.warmup) / (s.total - s.warmup);
  return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace meshtrain
