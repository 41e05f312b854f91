#include "core/bounded.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace meshtrain {

namespace {

constexpr auto kIntMin = std::numeric_limits<std::int64_t>::min();
constexpr auto kIntMax = std::numeric_limits<std::int64_t>::max();
constexpr double kRealMax = std::numeric_limits<double>::max();

// A flag's text as the message quotes it (bounded, so a megabyte of junk stays a line).
std::string quoted(std::string_view text) {
  if (text.size() > 40) return fmt::format("'{}...'", text.substr(0, 40));
  return fmt::format("'{}'", text);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

std::string describe(const IntRange& r) {
  if (r.max == kIntMax) return r.min == kIntMin ? "any integer" : fmt::format(">= {}", r.min);
  if (r.min == kIntMin) return fmt::format("<= {}", r.max);
  return fmt::format("in [{}, {}]", r.min, r.max);
}

std::string describe(const RealRange& r) {
  const bool low = r.min > -kRealMax, high = r.max < kRealMax;
  if (low && high)
    return fmt::format("in {}{}, {}{}", r.min_open ? '(' : '[', r.min, r.max, r.max_open ? ')' : ']');
  if (low) return fmt::format("{} {}", r.min_open ? ">" : ">=", r.min);
  if (high) return fmt::format("{} {}", r.max_open ? "<" : "<=", r.max);
  return "finite";
}

bool in_range(std::int64_t v, const IntRange& r) { return v >= r.min && v <= r.max; }

bool in_range(double v, const RealRange& r) {
  if (!std::isfinite(v)) return false;
  if (r.min_open ? !(v > r.min) : !(v >= r.min)) return false;
  if (r.max_open ? !(v < r.max) : !(v <= r.max)) return false;
  return true;
}

Status check_int(std::string_view name, std::int64_t v, const IntRange& r) {
  if (in_range(v, r)) return ok_status();
  // A negative count, rank or size is its own mistake (a sign, not a magnitude): say so first.
  if (v < 0 && r.min >= 0) return make_error("{} is negative ({}); it must be an integer {}", name, v, describe(r));
  return make_error("{} must be an integer {}, got {}", name, describe(r), v);
}

Status check_real(std::string_view name, double v, const RealRange& r) {
  if (in_range(v, r)) return ok_status();
  if (std::isfinite(v) && v < 0 && r.min >= 0)
    return make_error("{} is negative ({}); it must be a finite number {}", name, v, describe(r));
  return make_error("{} must be a finite number {}, got {}", name, describe(r), v);
}

Result<std::int64_t> parse_int(std::string_view name, std::string_view text, const IntRange& r) {
  std::string_view s = text;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (!all_digits(s.substr(!s.empty() && s[0] == '-' ? 1 : 0)))
    return make_error("{} must be an integer {}, got {}", name, describe(r), quoted(text));
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    return make_error("{} must be an integer {}, got {}", name, describe(r), quoted(text));
  MT_TRY(check_int(name, v, r));
  return v;
}

Result<std::uint64_t> parse_uint64(std::string_view name, std::string_view text, std::uint64_t max) {
  const std::string range = fmt::format("in [0, {}]", max);
  std::string_view digits = text;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  if (digits.size() > 1 && digits[0] == '-' && all_digits(digits.substr(1)))
    return make_error("{} is negative ({}); it must be an integer {}", name, text, range);
  if (!all_digits(digits)) return make_error("{} must be an integer {}, got {}", name, range, quoted(text));
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v > max)
    return make_error("{} must be an integer {}, got {}", name, range, quoted(text));
  return v;
}

Result<double> parse_real(std::string_view name, std::string_view text, const RealRange& r) {
  // strtod wants a terminated string; a flag's value is short.
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() || std::isspace(static_cast<unsigned char>(s[0])) ? 0 : std::strtod(s.c_str(), &end);
  if (end == nullptr || end != s.c_str() + s.size())
    return make_error("{} must be a finite number {}, got {}", name, describe(r), quoted(text));
  MT_TRY(check_real(name, v, r));
  return v;
}

}  // namespace meshtrain
