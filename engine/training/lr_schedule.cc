#include "engine/training/lr_schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

#include "core/names.h"

namespace meshtrain {

Result<LrDecay> parse_lr_decay(std::string_view name) {
  if (name == "cosine") return LrDecay::cosine;
  if (name == "linear") return LrDecay::linear;
  if (name == "constant") return LrDecay::constant;
  if (name == "wsd") return LrDecay::wsd;
  return Error(unknown_name_message("--lr-decay", name, {"cosine", "linear", "constant", "wsd"}));
}

std::string lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::cosine: return "cosine";
    case LrDecay::linear: return "linear";
    case LrDecay::constant: return "constant";
    case LrDecay::wsd: return "wsd";
  }
  return "cosine";
}

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
  if (s.decay_steps < 0 || s.decay_steps > s.total - s.warmup)
    return make_error("--decay-steps {} must be between 0 (the default) and the {} steps after the {}-step warm-up "
                      "(--steps {}); lower it, or shorten --warmup",
                      s.decay_steps, s.total - s.warmup, s.warmup, s.total);
  return ok_status();
}

int decay_steps(const LrSchedule& s) {
  if (s.decay_steps > 0) return s.decay_steps;
  const int after = s.total - s.warmup;
  return s.decay == LrDecay::wsd ? (after + 4) / 5 : after;
}

double lr_at(const LrSchedule& s, int step) {
  assert(step >= 1);
  if (step <= s.warmup) return s.lr * step / s.warmup;
  const int D = decay_steps(s);
  if (s.decay == LrDecay::constant) return s.lr;
  // Where the decay starts: right after the warm-up, or (wsd) D steps before the end.
  const int start = s.decay == LrDecay::wsd ? s.total - D : s.warmup;
  if (step <= start) return s.lr;
  if (D <= 0 || step >= start + D) return s.min_lr;
  const double t = static_cast<double>(step - start) / D;
  const double shape = s.decay == LrDecay::cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * t)) : 1.0 - t;
  return s.min_lr + (s.lr - s.min_lr) * shape;
}

}  // namespace meshtrain
