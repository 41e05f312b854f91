// JSON from users: parsing with bounds, and reading an object's fields with
// their types and ranges checked. Every JSON input (model, plan, cluster,
// calibration, checkpoint manifest) goes through here:
//
//   * load_json_file = read_input_file (core/input_file.h) + parse_json;
//   * parse_json refuses nesting deeper than kMaxJsonDepth before the
//     (recursive) parser sees it, and turns every parser exception (syntax,
//     a number like 1e400 that overflows a double) into an Error;
//   * JsonFields reads optional fields of one object: a wrong type or a value
//     out of range is an Error naming the field and its range
//     ("model field 'layers' must be an integer in [1, 65536], got 2147483648"),
//     and unknown fields are Errors that suggest the nearest known one.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bounded.h"
#include "core/names.h"
#include "core/status.h"

namespace meshtrain {

// Deeper than any meshtrain file (a calibration is 4 levels); far below the
// depth at which the recursive parser and destructor run out of stack.
inline constexpr int kMaxJsonDepth = 64;

// `what` names the input in errors ("model file 'm.json'").
Result<nlohmann::json> parse_json(std::string_view text, std::string_view what);
Result<nlohmann::json> load_json_file(const std::string& path, std::string_view what);

// The integer `v`, or "<name> must be an integer in [min, max], got <v>".
Result<std::int64_t> json_int(const nlohmann::json& v, std::string_view name, const IntRange& range);

// At most `max_chars` of v.dump(), for messages that quote a bad value.
std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars = 60);

// The fields of one JSON object. `what` prefixes each field's name in
// messages: JsonFields(j, "model field") says "model field 'layers' ...".
// Every getter leaves `out` unchanged when the field is absent.
class JsonFields {
 public:
  // An error unless `object` is a JSON object; `shape` says what it should hold.
  static Result<JsonFields> of(const nlohmann::json& object, std::string what, std::string_view shape);

  bool has(std::string_view key) const { return j_->contains(key); }
  const nlohmann::json& at(std::string_view key) const { return (*j_)[std::string(key)]; }
  // "model field 'layers'": how messages name `key`.
  std::string name(std::string_view key) const;

  // Every key must be one of `known`; otherwise an Error suggesting the nearest.
  Status check_known(const std::vector<std::string>& known) const;
  // Every key of `required` must be present; the first absent one is named as
  // missing ("model field 'layers' is missing; <why>"), not as a default's range.
  Status require(const std::vector<std::string>& required, std::string_view why) const;

  template <class T>
  Status get_int(std::string_view key, const IntRange& range, T& out) const {
    static_assert(std::is_integral_v<T>);
    if (!has(key)) return ok_status();
    MT_ASSIGN(const std::int64_t v, int_value(key, clamp_to<T>(range)));
    out = static_cast<T>(v);
    return ok_status();
  }
  template <class T>
  Status get_int(std::string_view key, const IntRange& range, std::optional<T>& out) const {
    T v{};
    if (!has(key)) return ok_status();
    MT_TRY(get_int(key, range, v));
    out = v;
    return ok_status();
  }
  Status get_uint64(std::string_view key, std::uint64_t max, std::uint64_t& out) const;
  Status get_real(std::string_view key, const RealRange& range, double& out) const;
  Status get_real(std::string_view key, const RealRange& range, float& out) const;
  Status get_real(std::string_view key, const RealRange& range, std::optional<double>& out) const;
  Status get_bool(std::string_view key, bool& out) const;
  Status get_bool(std::string_view key, std::optional<bool>& out) const;
  Status get_string(std::string_view key, std::string& out) const;
  Status get_string(std::string_view key, std::optional<std::string>& out) const;
  // A string field naming one of `names`' values (an unknown name is refused with the nearest).
  template <class E>
  Status get_choice(std::string_view key, const EnumNames<E>& names, E& out) const {
    if (!has(key)) return ok_status();
    std::string s;
    MT_TRY(get_string(key, s));
    MT_ASSIGN(out, names.parse(std::string(key), s));
    return ok_status();
  }

 private:
  JsonFields(const nlohmann::json& j, std::string what) : j_(&j), what_(std::move(what)) {}
  template <class T>
  static IntRange clamp_to(IntRange r) {
    using L = std::numeric_limits<T>;
    const auto lo = static_cast<std::int64_t>(L::min());
    const auto hi = L::max() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                        ? std::numeric_limits<std::int64_t>::max()
                        : static_cast<std::int64_t>(L::max());
    return {std::max(r.min, lo), std::min(r.max, hi)};
  }
  Result<std::int64_t> int_value(std::string_view key, const IntRange& range) const;

  const nlohmann::json* j_;
  std::string what_;
};

}  // namespace meshtrain
