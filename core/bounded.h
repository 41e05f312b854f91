// Numbers from users, bounded: every integer and real that a flag or a file
// field supplies goes through these, so a value out of range is refused with
// the field's name and its range instead of wrapping, truncating or poisoning
// a run (`{"tp": 4294967297}` must not run as tp 1; `--lr inf` must not train).
//
// Integers are decimal digits with an optional sign, nothing else: "1e8",
// "2.0" and "0x10" are not integers. Reals are finite: "nan" and "inf" are
// refused whatever the range.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain {

struct IntRange {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};

// [min, max], either end open when asked: (0, 10] is {0, 10, true, false}.
struct RealRange {
  double min = -std::numeric_limits<double>::max();
  double max = std::numeric_limits<double>::max();
  bool min_open = false;
  bool max_open = false;
};

// "in [1, 65536]", ">= 1", "in (0, 10]", "> 0", ...: the range as a message says it.
std::string describe(const IntRange& r);
std::string describe(const RealRange& r);

bool in_range(std::int64_t v, const IntRange& r);
bool in_range(double v, const RealRange& r);

// "<name> must be an integer in [1, 8], got 9" unless v is in r.
Status check_int(std::string_view name, std::int64_t v, const IntRange& r);
// "<name> must be a finite number in (0, 10], got inf" unless v is finite and in r.
Status check_real(std::string_view name, double v, const RealRange& r);

// Parses `text` (a flag's value) as above. Unsigned 64-bit values (seeds) go
// through parse_uint64, whose range is [0, max].
Result<std::int64_t> parse_int(std::string_view name, std::string_view text, const IntRange& r);
Result<std::uint64_t> parse_uint64(std::string_view name, std::string_view text, std::uint64_t max);
Result<double> parse_real(std::string_view name, std::string_view text, const RealRange& r);

}  // namespace meshtrain
