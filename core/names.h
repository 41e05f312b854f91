// Small helpers for user-facing names: nearest-name suggestions for typos.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace meshtrain {

// Levenshtein edit distance.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate nearest to `name`; empty if there are no candidates.
inline std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

// "unknown <what> 'name' (did you mean 'x'? valid: a, b, c)".
inline std::string unknown_name_message(std::string_view what, std::string_view name,
                                        const std::vector<std::string>& valid) {
  std::string list;
  for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
  return "unknown " + std::string(what) + " '" + std::string(name) + "' (did you mean '" +
         nearest_name(name, valid) + "'? valid: " + list + ")";
}

// The names of an enumeration's values, as files and flags spell them.
template <class E>
struct EnumNames {
  std::vector<std::pair<E, std::string>> items;
  std::string name(E e) const {
    for (auto& [k, v] : items)
      if (k == e) return v;
    return "?";
  }
  // The value `s` names; an unknown name is refused with the nearest (`field` names what was read).
  Result<E> parse(const std::string& field, const std::string& s) const {
    std::vector<std::string> valid;
    for (auto& [k, v] : items) {
      if (v == s) return k;
      valid.push_back(v);
    }
    return Error(unknown_name_message(field, s, valid));
  }
};

}  // namespace meshtrain
