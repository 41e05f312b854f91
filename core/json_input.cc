#include "core/json_input.h"

#include "core/input_file.h"
#include "core/names.h"

namespace meshtrain {

namespace {

// The nesting depth of `text` outside strings, or the byte offset where it
// first exceeds kMaxJsonDepth. Malformed text is left to the parser.
std::optional<std::size_t> too_deep_at(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

// nlohmann quotes the bytes it stopped at; binary junk must not reach the terminal.
std::string printable(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return s;
}

}  // namespace

Result<nlohmann::json> parse_json(std::string_view text, std::string_view what) {
  if (auto at = too_deep_at(text))
    return make_error("{} nests deeper than {} levels (at byte {}); no meshtrain file needs more than a few",
                      what, kMaxJsonDepth, *at);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // parse_error (syntax) and out_of_range (a number such as 1e400 that no double holds).
    // e.what() starts "[json.exception.parse_error.101] "; the rest is the message.
    std::string message = e.what();
    if (message.starts_with("[json.exception.")) message = message.substr(message.find("] ") + 2);
    if (e.id == 406) message += " (no number that large fits)";
    return make_error("{} is not valid JSON: {}", what, printable(message));
  }
}

Result<nlohmann::json> load_json_file(const std::string& path, std::string_view what) {
  MT_ASSIGN(const std::string text, read_input_file(path, what));
  return parse_json(text, fmt::format("{} '{}'", what, path));
}

std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

Result<JsonFields> JsonFields::of(const nlohmann::json& object, std::string what, std::string_view shape) {
  if (!object.is_object()) return make_error("{}, got {}", shape, json_excerpt(object));
  return JsonFields(object, std::move(what));
}

std::string JsonFields::name(std::string_view key) const { return fmt::format("{} '{}'", what_, key); }

Status JsonFields::check_known(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : j_->items()) {
    bool found = false;
    for (const auto& k : known) found = found || k == key;
    if (!found) return Error(unknown_name_message(what_, key, known));
  }
  return ok_status();
}

Status JsonFields::require(const std::vector<std::string>& required, std::string_view why) const {
  for (const auto& key : required)
    if (!has(key)) return make_error("{} is missing; {}", name(key), why);
  return ok_status();
}

Result<std::int64_t> json_int(const nlohmann::json& v, std::string_view name, const IntRange& range) {
  std::int64_t out = 0;
  bool fits = false;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    fits = u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    out = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    fits = true;
    out = v.get<std::int64_t>();
  }
  if (fits && !in_range(out, range)) MT_TRY(check_int(name, out, range));  // says "negative" for a negative one
  if (!fits) return make_error("{} must be an integer {}, got {}", name, describe(range), json_excerpt(v));
  return out;
}

Result<std::int64_t> JsonFields::int_value(std::string_view key, const IntRange& range) const {
  return json_int(at(key), name(key), range);
}

Status JsonFields::get_uint64(std::string_view key, std::uint64_t max, std::uint64_t& out) const {
  if (!has(key)) return ok_status();
  const nlohmann::json& v = at(key);
  const bool fits = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!fits || v.get<std::uint64_t>() > max)
    return make_error("{} must be an integer in [0, {}], got {}", name(key), max, json_excerpt(v));
  out = v.get<std::uint64_t>();
  return ok_status();
}

Status JsonFields::get_real(std::string_view key, const RealRange& range, double& out) const {
  if (!has(key)) return ok_status();
  const nlohmann::json& v = at(key);
  if (!v.is_number()) return make_error("{} must be a number {}, got {}", name(key), describe(range), json_excerpt(v));
  if (v.get<double>() < 0 && range.min >= 0)
    return make_error("{} is negative ({}); it must be a number {}", name(key), json_excerpt(v), describe(range));
  if (!in_range(v.get<double>(), range))
    return make_error("{} must be a number {}, got {}", name(key), describe(range), json_excerpt(v));
  out = v.get<double>();
  return ok_status();
}

Status JsonFields::get_real(std::string_view key, const RealRange& range, float& out) const {
  double v = out;
  MT_TRY(get_real(key, range, v));
  out = static_cast<float>(v);
  return ok_status();
}

Status JsonFields::get_real(std::string_view key, const RealRange& range, std::optional<double>& out) const {
  double v = 0;
  if (!has(key)) return ok_status();
  MT_TRY(get_real(key, range, v));
  out = v;
  return ok_status();
}

Status JsonFields::get_bool(std::string_view key, bool& out) const {
  if (!has(key)) return ok_status();
  if (!at(key).is_boolean()) return make_error("{} must be true or false, got {}", name(key), json_excerpt(at(key)));
  out = at(key).get<bool>();
  return ok_status();
}

Status JsonFields::get_bool(std::string_view key, std::optional<bool>& out) const {
  bool v = false;
  if (!has(key)) return ok_status();
  MT_TRY(get_bool(key, v));
  out = v;
  return ok_status();
}

Status JsonFields::get_string(std::string_view key, std::string& out) const {
  if (!has(key)) return ok_status();
  if (!at(key).is_string()) return make_error("{} must be a string, got {}", name(key), json_excerpt(at(key)));
  out = at(key).get<std::string>();
  return ok_status();
}

Status JsonFields::get_string(std::string_view key, std::optional<std::string>& out) const {
  std::string v;
  if (!has(key)) return ok_status();
  MT_TRY(get_string(key, v));
  out = std::move(v);
  return ok_status();
}

}  // namespace meshtrain
