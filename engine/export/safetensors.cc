#include "engine/export/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/json_input.h"

namespace meshtrain {

// Tensor bytes are the host's, copied as they are: little-endian hosts only.
static_assert(std::endian::native == std::endian::little);

namespace {

constexpr std::string_view kMetadata = "__metadata__";
// The reference implementation refuses larger headers (safetensors' MAX_HEADER_SIZE).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// Far above any tensor, far below where a count of bytes would overflow.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 48;

std::uint16_t bf16_bits(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  if (std::isnan(v)) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // stays a (quiet) NaN
  return static_cast<std::uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

std::uint16_t f16_bits(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  const std::uint32_t a = u & 0x7FFFFFFF;
  if (a >= 0x7F800000) return sign | (a > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (a >= 0x477FF000) return sign | 0x7C00;  // 65520 and up round to infinity
  if (a < 0x38800000) {                       // below 2^-14: a subnormal half, steps of 2^-24
    const float steps = std::nearbyint(std::fabs(v) * 16777216.f);  // round to nearest even
    return sign | static_cast<std::uint16_t>(steps);
  }
  std::uint32_t h = (((a >> 23) - 112) << 10) | ((a & 0x7FFFFF) >> 13);
  const std::uint32_t rest = a & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry moves into the exponent, as it should
  return sign | static_cast<std::uint16_t>(h);
}

float f16_value(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  const std::uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) {
    const float v = static_cast<float>(m) / 16777216.f;
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000 | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

Result<SafeDType> parse_dtype(const nlohmann::json& v, const std::string& where) {
  const std::string s = v.is_string() ? v.get<std::string>() : json_excerpt(v);
  for (SafeDType t : {SafeDType::f32, SafeDType::bf16, SafeDType::f16})
    if (s == safe_dtype_name(t)) return t;
  return make_error("{} has dtype {}; meshtrain reads F32, BF16 and F16 tensors (convert the file to one of them)",
                    where, s);
}

Result<std::vector<std::int64_t>> parse_shape(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array()) return make_error("{}: \"shape\" must be an array of sizes, got {}", where, json_excerpt(v));
  std::vector<std::int64_t> shape;
  std::int64_t n = 1;
  for (const nlohmann::json& d : v) {
    if (!d.is_number_unsigned()) return make_error("{}: \"shape\" holds {}, not a size", where, json_excerpt(d));
    const std::uint64_t size = d.get<std::uint64_t>();
    const bool too_large = size > static_cast<std::uint64_t>(kMaxElements) ||
                           (size > 0 && n > kMaxElements / static_cast<std::int64_t>(size));
    if (too_large)
      return make_error("{}: shape {} is too large", where, v.dump());
    shape.push_back(static_cast<std::int64_t>(size));
    n *= static_cast<std::int64_t>(size);
  }
  return shape;
}

struct Extent {
  std::string name;
  std::uint64_t begin = 0, end = 0;
};

Result<Extent> parse_offsets(const nlohmann::json& v, const std::string& name, const std::string& where,
                             std::uint64_t data_bytes) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned())
    return make_error("{}: \"data_offsets\" must be [begin, end], got {}", where, json_excerpt(v));
  Extent e{name, v[0].get<std::uint64_t>(), v[1].get<std::uint64_t>()};
  if (e.begin > e.end) return make_error("{}: \"data_offsets\" [{}, {}] ends before it begins", where, e.begin, e.end);
  if (e.end > data_bytes)
    return make_error("{}: \"data_offsets\" [{}, {}] run past the end of the data ({} bytes): the file is truncated",
                      where, e.begin, e.end, data_bytes);
  return e;
}

Result<std::map<std::string, std::string>> parse_metadata(const nlohmann::json& v, const std::string& path) {
  if (!v.is_object()) return make_error("'{}': \"__metadata__\" must be an object of strings", path);
  std::map<std::string, std::string> out;
  for (const auto& [k, s] : v.items()) {
    if (!s.is_string())
      return make_error("'{}': \"__metadata__\" entry \"{}\" is {}, the format allows only strings", path, k,
                        json_excerpt(s));
    out.emplace(k, s.get<std::string>());
  }
  return out;
}

// The extents, sorted, must tile [0, data_bytes) exactly.
Status check_tiling(std::vector<Extent> extents, std::uint64_t data_bytes, const std::string& path) {
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t at = 0;
  const Extent* previous = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < at)
      return make_error("'{}': tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}) of the data); the file is "
                        "damaged or not a safetensors file",
                        path, previous->name, e.name, previous->begin, previous->end, e.begin, e.end);
    if (e.begin > at)
      return make_error("'{}': bytes [{}, {}) of the data belong to no tensor (before '{}'); the format forbids holes",
                        path, at, e.begin, e.name);
    at = e.end;
    previous = &e;
  }
  if (at != data_bytes)
    return make_error("'{}': the last {} bytes of the file belong to no tensor; the format forbids trailing data",
                      path, data_bytes - at);
  return ok_status();
}

}  // namespace

std::string_view safe_dtype_name(SafeDType t) {
  switch (t) {
    case SafeDType::f32: return "F32";
    case SafeDType::bf16: return "BF16";
    case SafeDType::f16: return "F16";
  }
  return "?";
}

std::size_t safe_dtype_bytes(SafeDType t) { return t == SafeDType::f32 ? 4 : 2; }

Result<std::string> encode_safetensors(const std::vector<SafeTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[std::string(kMetadata)] = metadata;
  std::uint64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    if (t.bytes.size() != static_cast<std::uint64_t>(n) * safe_dtype_bytes(t.dtype))
      return make_error("tensor '{}' of shape {} holds {} bytes, its {} elements of {} need {}", t.name,
                        nlohmann::json(t.shape).dump(), t.bytes.size(), n, safe_dtype_name(t.dtype),
                        n * static_cast<std::int64_t>(safe_dtype_bytes(t.dtype)));
    if (t.name == kMetadata || header.contains(t.name)) return make_error("tensor name '{}' is used twice", t.name);
    header[t.name] = {{"dtype", safe_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out.reserve(8 + text.size() + offset);
  out += text;
  for (const SafeTensor& t : tensors) out += t.bytes;
  return out;
}

Result<SafetensorsFile> decode_safetensors(std::string_view file, const std::string& path) {
  if (file.size() < 8)
    return make_error("'{}' is {} bytes, too short for a safetensors file (8 bytes of header length first)", path,
                      file.size());
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > file.size() - 8)
    return make_error("'{}': the header length {} runs past the end of the file ({} bytes): truncated, or not a "
                      "safetensors file",
                      path, n, file.size());
  if (n > kMaxHeaderBytes)
    return make_error("'{}': the header of {} bytes is over the format's limit of {}", path, n, kMaxHeaderBytes);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.is_object())
    return make_error("'{}': the {}-byte header is not a JSON object; the file is damaged or not a safetensors file",
                      path, n);
  const std::uint64_t data_bytes = file.size() - 8 - n;
  const std::string_view data = file.substr(8 + n);
  SafetensorsFile out;
  std::vector<Extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadata) {
      MT_ASSIGN(out.metadata, parse_metadata(entry, path));
      continue;
    }
    const std::string where = fmt::format("'{}': tensor '{}'", path, name);
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      return make_error("{} needs \"dtype\", \"shape\" and \"data_offsets\", got {}", where, json_excerpt(entry));
    SafeTensor t;
    t.name = name;
    MT_ASSIGN(t.dtype, parse_dtype(entry["dtype"], where));
    MT_ASSIGN(t.shape, parse_shape(entry["shape"], where));
    MT_ASSIGN(Extent e, parse_offsets(entry["data_offsets"], name, where, data_bytes));
    std::uint64_t elements = 1;
    for (std::int64_t d : t.shape) elements *= static_cast<std::uint64_t>(d);
    if (e.end - e.begin != elements * safe_dtype_bytes(t.dtype))
      return make_error("{}: shape {} of {} is {} bytes, but \"data_offsets\" [{}, {}] span {}", where,
                        entry["shape"].dump(), safe_dtype_name(t.dtype), elements * safe_dtype_bytes(t.dtype),
                        e.begin, e.end, e.end - e.begin);
    t.bytes.assign(data.substr(e.begin, e.end - e.begin));
    extents.push_back(std::move(e));
    out.tensors.push_back(std::move(t));
  }
  MT_TRY(check_tiling(extents, data_bytes, path));
  // In the order of their data, as the writer laid them out.
  std::vector<std::size_t> order(out.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return extents[a].begin < extents[b].begin; });
  std::vector<SafeTensor> sorted;
  sorted.reserve(order.size());
  for (std::size_t i : order) sorted.push_back(std::move(out.tensors[i]));
  out.tensors = std::move(sorted);
  return out;
}

std::vector<float> to_float32(const SafeTensor& t) {
  const std::size_t n = t.bytes.size() / safe_dtype_bytes(t.dtype);
  std::vector<float> out(n);
  if (t.dtype == SafeDType::f32) {
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
    return out;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h = 0;
    std::memcpy(&h, t.bytes.data() + 2 * i, 2);
    out[i] = t.dtype == SafeDType::bf16 ? std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16) : f16_value(h);
  }
  return out;
}

std::string from_float32(const std::vector<float>& values, SafeDType dtype) {
  if (dtype == SafeDType::f32) return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  std::string out(values.size() * 2, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t h = dtype == SafeDType::bf16 ? bf16_bits(values[i]) : f16_bits(values[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

}  // namespace meshtrain
