// Command-line numbers go through core/bounded.h like file fields do: each
// numeric flag carries one of these CLI11 validators, which parses and
// range-checks the flag's text before CLI11 converts it, so `--tp 0`,
// `--lr inf`, `--seed -1` or `--micro-batch 1e8` is refused with the flag's
// range ("--lr: must be a finite number in (0, 10], got 'inf'").
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "core/bounded.h"

namespace meshtrain {

namespace detail {
// CLI11 prefixes the flag's name and a colon; the message starts after it.
template <class T>
std::string flag_message(const Result<T>& r) {
  if (r.ok()) return {};
  std::string m = r.error().message();
  return m.starts_with(" ") ? m.substr(1) : m;
}
}  // namespace detail

inline CLI::Validator int_in(IntRange r) {
  return CLI::Validator([r](std::string& s) { return detail::flag_message(parse_int("", s, r)); },
                        "INT " + describe(r));
}

inline CLI::Validator real_in(RealRange r) {
  return CLI::Validator([r](std::string& s) { return detail::flag_message(parse_real("", s, r)); },
                        "NUMBER " + describe(r));
}

inline CLI::Validator uint64_up_to(std::uint64_t max) {
  return CLI::Validator([max](std::string& s) { return detail::flag_message(parse_uint64("", s, max)); },
                        "INT in [0, " + std::to_string(max) + "]");
}

}  // namespace meshtrain
