#include "core/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace meshtrain {

namespace {

struct Fp8Layout {
  int mantissa_bits;
  int bias;
  float max;
};

Fp8Layout layout(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Layout{3, 7, 448.f} : Fp8Layout{2, 15, 57344.f};
}

}  // namespace

float fp8_max(Fp8Format f) { return layout(f).max; }

float round_to_fp8(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const Fp8Layout l = layout(f);
  const float a = std::fabs(x);
  if (a == 0) return x;
  if (a >= l.max) return std::copysign(l.max, x);
  // The spacing of FP8 numbers around a: 2^(e - mantissa_bits) for a normal a of exponent e,
  // the subnormals' fixed spacing below the smallest normal exponent 1 - bias.
  const int e = std::max(std::ilogb(a), 1 - l.bias);
  const float quantum = std::ldexp(1.f, e - l.mantissa_bits);
  // a / quantum is exact (a power of two) and well inside float's range; nearbyint rounds
  // half to even in the default rounding mode, which nothing in meshtrain changes.
  const float r = std::nearbyint(a / quantum) * quantum;
  return std::copysign(std::min(r, l.max), x);
}

std::uint8_t fp8_bits(float x, Fp8Format f) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7F);
  const Fp8Layout l = layout(f);
  const float r = std::fabs(round_to_fp8(x, f));
  if (r == 0) return sign;
  const int e = std::ilogb(r);
  const int exponent = std::max(e + l.bias, 0);  // 0: subnormal
  const int scale_exp = (exponent == 0 ? 1 - l.bias : e) - l.mantissa_bits;
  const int significand = static_cast<int>(std::ldexp(r, -scale_exp));  // exact: r is a multiple of the quantum
  const int mantissa = significand & ((1 << l.mantissa_bits) - 1);
  return static_cast<std::uint8_t>(sign | (exponent << l.mantissa_bits) | mantissa);
}

float fp8_value(std::uint8_t bits, Fp8Format f) {
  const Fp8Layout l = layout(f);
  const int exponent_bits = 7 - l.mantissa_bits;
  const int mantissa = bits & ((1 << l.mantissa_bits) - 1);
  const int exponent = (bits & 0x7F) >> l.mantissa_bits;
  const float sign = bits & 0x80 ? -1.f : 1.f;
  const int top = (1 << exponent_bits) - 1;
  if (f == Fp8Format::e4m3 && exponent == top && mantissa == (1 << l.mantissa_bits) - 1) return std::nanf("");
  if (f == Fp8Format::e5m2 && exponent == top)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - l.bias - l.mantissa_bits);
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << l.mantissa_bits)), exponent - l.bias - l.mantissa_bits);
}

float amax(std::span<const float> xs) {
  float m = 0;
  for (float x : xs) {
    if (std::isnan(x)) return x;
    m = std::max(m, std::fabs(x));
  }
  return m;
}

void fp8_quantize(std::span<const float> xs, float scale, Fp8Format f, std::span<float> out) {
  const float inverse = 1.f / scale;
  const std::size_t n = std::min(xs.size(), out.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = round_to_fp8(xs[i] * scale, f) * inverse;
}

float current_scale(float amax, Fp8Format f) {
  if (!std::isfinite(amax) || amax == 0.f) return 1.f;
  const float scale = fp8_max(f) / std::fabs(amax);
  if (std::isinf(scale)) return std::numeric_limits<float>::max();
  return std::isnan(scale) ? 1.f : scale;
}

Result<DelayedScaling> DelayedScaling::make(Fp8Format format, int history, int margin) {
  if (history < 1 || history > 1 << 20)
    return make_error("FP8 delayed scaling: amax history of {} steps; give 1 to 1048576 (Transformer Engine's "
                      "default is 1024)",
                      history);
  if (margin < 0 || margin > 64)
    return make_error("FP8 delayed scaling: margin {}; give 0 to 64 (powers of two of headroom, usually 0)", margin);
  return DelayedScaling(format, history, margin);
}

DelayedScaling::DelayedScaling(Fp8Format format, int history, int margin)
    : format_(format), margin_(margin), history_(static_cast<std::size_t>(history), 0.f) {}

void DelayedScaling::record(float step_amax) {
  history_[next_] = std::isfinite(step_amax) ? std::fabs(step_amax) : 0.f;
  next_ = (next_ + 1) % history_.size();
  const float m = *std::max_element(history_.begin(), history_.end());
  // A zero or non-finite amax says nothing about the range: the previous scale stays (TE does the same).
  if (m > 0) scale_ = std::ldexp(fp8_max(format_) / m, -margin_);
}

std::vector<float> DelayedScaling::state() const {
  std::vector<float> out{scale_};
  for (std::size_t i = 0; i < history_.size(); ++i) out.push_back(history_[(next_ + i) % history_.size()]);
  return out;
}

Status DelayedScaling::restore(std::span<const float> state) {
  if (state.size() != history_.size() + 1)
    return make_error("FP8 scaling state of {} values; this recipe keeps {} (the scale and an amax history of {} "
                      "steps)",
                      state.size(), history_.size() + 1, history_.size());
  if (!std::isfinite(state[0]) || !(state[0] > 0))
    return make_error("FP8 scaling state: scale {} is not a finite positive number", state[0]);
  for (float a : state.subspan(1))
    if (!std::isfinite(a) || a < 0)
      return make_error("FP8 scaling state: amax {} is not a finite number >= 0", a);
  scale_ = state[0];
  std::copy(state.begin() + 1, state.end(), history_.begin());
  next_ = 0;  // the oldest first: the next step overwrites it
  return ok_status();
}

}  // namespace meshtrain
