#include "simulator/calibration.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "core/json_input.h"
#include "simulator/calibration_interpolate.h"

namespace meshtrain::sim {
namespace {

using nlohmann::json;
using Point = ThroughputPoint;

// Entry i of the calibration list `where`: the readers of its fields name both in their errors.
struct Entry {
  const json& value;
  const char* where;
  size_t i;
};

Status need(const Entry& e, const char* key) {
  if (!e.value.contains(key)) return make_error("{}[{}]: missing field '{}'", e.where, e.i, key);
  return ok_status();
}

// The range of each numeric field of an entry (core/bounded.h): beyond any
// measurement, far from where a time or a byte count overflows.
RealRange real_range(std::string_view key) {
  if (key == "bytes") return {1, 1e15};
  if (key == "GBps" || key == "busbw_GBps") return {1e-6, 1e7};
  if (key == "latency_us") return {1e-6, 1e9};
  return {1e-3, 1e9};  // time_us, p10_us, p90_us: a nanosecond to a quarter of an hour
}

IntRange int_range(std::string_view key) {
  if (key == "head_dim") return {1, 1 << 16};
  if (key == "members") return {1, 1 << 20};
  if (key == "samples") return {1, 1 << 30};
  if (key == "ranks_sharing") return {1, 1 << 10};
  if (key == "groups") return {1, 1 << 16};
  return {1, 1 << 24};  // m, n, k, rows, batch_heads, seq
}

JsonFields entry_fields(const Entry& e) {
  return JsonFields::of(e.value, fmt::format("{}[{}]: field", e.where, e.i), "").value();
}

Result<double> positive(const Entry& e, const char* key) {
  MT_TRY(need(e, key));
  double v = 0;
  MT_TRY(entry_fields(e).get_real(key, real_range(key), v));
  return v;
}

Result<int64_t> positive_int(const Entry& e, const char* key) {
  MT_TRY(need(e, key));
  int64_t v = 0;
  MT_TRY(entry_fields(e).get_int(key, int_range(key), v));
  return v;
}

// The optional boolean field `key` of entry e: false when
// absent; `what` says what its values mean.
Result<bool> optional_bool(const Entry& e, const char* key, const char* what = "true or false") {
  if (!e.value.contains(key)) return false;
  if (!e.value[key].is_boolean()) return make_error("{}[{}]: field '{}' must be {}", e.where, e.i, key, what);
  return e.value[key].get<bool>();
}

// The fields an entry of each list may hold: every entry is checked against
// them, so a misspelt field is refused rather than silently left at its default.
std::vector<std::string> entry_fields_of(std::string_view list) {
  const std::vector<std::string> spread = {"p10_us", "p90_us", "samples", "ranks_sharing"};
  std::vector<std::string> own;
  if (list == "gemm") own = {"m", "n", "k", "dtype", "time_us"};
  if (list == "grouped_gemm") own = {"groups", "rows", "n", "k", "dtype", "wgrad", "time_us"};
  if (list == "attention") own = {"batch_heads", "seq", "head_dim", "causal", "backward", "time_us"};
  if (list == "memory") own = {"bytes", "time_us"};
  if (list == "ops") own = {"op", "bytes", "time_us"};
  if (list == "links") return {"kind", "GBps", "latency_us"};
  if (list == "collectives") own = {"kind", "members", "bytes", "busbw_GBps", "transport"};
  own.insert(own.end(), spread.begin(), spread.end());
  return own;
}

Result<const json*> list(const json& j, const char* key) {
  if (!j.contains(key)) return static_cast<const json*>(nullptr);
  if (!j[key].is_array()) return make_error("field '{}' must be a list [...]", key);
  const std::vector<std::string> known = entry_fields_of(key);
  for (size_t i = 0; i < j[key].size(); ++i) {
    if (!j[key][i].is_object()) return make_error("{}[{}] must be an object {{...}}", key, i);
    MT_TRY(entry_fields({j[key][i], key, i}).check_known(known));
  }
  return &j[key];
}

// read(entry) for each entry of the optional list `key`, after list()'s checks; the first error stops.
template <class Read>
Status for_each_entry(const json& j, const char* key, Read read) {
  MT_ASSIGN(const json* entries, list(j, key));
  for (size_t i = 0; entries && i < entries->size(); ++i) MT_TRY(read(Entry{(*entries)[i], key, i}));
  return ok_status();
}

// The optional spread fields of an entry.
Result<Calibration::Spread> spread_of(const Entry& e) {
  Calibration::Spread s;
  for (const char* key : {"p10_us", "p90_us"})
    if (e.value.contains(key)) {
      MT_ASSIGN(double v, positive(e, key));
      (std::string_view(key) == "p10_us" ? s.p10_us : s.p90_us) = v;
    }
  if (e.value.contains("samples")) {
    MT_ASSIGN(int64_t n, positive_int(e, "samples"));
    s.samples = static_cast<int>(n);
  }
  if (e.value.contains("ranks_sharing")) {
    MT_ASSIGN(int64_t n, positive_int(e, "ranks_sharing"));
    s.ranks_sharing = static_cast<int>(n);
  }
  return s;
}

Result<Calibration::Machine> machine_from_json(const json& m) {
  if (!m.is_object()) return make_error("field 'machine' must be an object {{\"cpu\": ...}}");
  Calibration::Machine out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "backend" || key == "cpu" || key == "date") {
      if (!v.is_string()) return make_error("field 'machine.{}' must be a string", key);
      (key == "backend" ? out.backend : key == "cpu" ? out.cpu : out.date) = v.get<std::string>();
      if (key == "backend" && out.backend != "cpu" && out.backend != "cuda")
        return make_error("field 'machine.backend' must be \"cpu\" or \"cuda\" (the backend that measured it), "
                          "got {}", v.dump());
    } else if (key == "cores") {
      MT_TRY(JsonFields::of(m, "machine field", "").value().get_int("cores", IntRange{1, 1 << 20}, out.cores));
    } else if (key == "libraries") {
      if (!v.is_object())
        return make_error("field 'machine.libraries' must be an object {{\"OpenBLAS\": \"0.3.21\"}}");
      for (auto l = v.begin(); l != v.end(); ++l) {
        if (!l.value().is_string())
          return make_error("field 'machine.libraries.{}' must be a version string", l.key());
        out.libraries.emplace_back(l.key(), l.value().get<std::string>());
      }
    } else if (key == "notes") {
      if (!v.is_array()) return make_error("field 'machine.notes' must be a list of strings");
      for (const json& n : v) {
        if (!n.is_string()) return make_error("field 'machine.notes' must be a list of strings");
        out.notes.push_back(n.get<std::string>());
      }
    } else {
      return make_error(
          "unknown field 'machine.{}'; known: backend, cpu, cores, date, libraries, notes", key);
    }
  }
  return out;
}

json machine_to_json(const Calibration::Machine& m) {
  json j = json::object();
  if (!m.backend.empty()) j["backend"] = m.backend;
  if (!m.cpu.empty()) j["cpu"] = m.cpu;
  if (m.cores > 0) j["cores"] = m.cores;
  if (!m.date.empty()) j["date"] = m.date;
  if (!m.libraries.empty()) {
    // nlohmann's object sorts keys; the reader keeps that order, so the round trip is exact.
    json l = json::object();
    for (const auto& [name, version] : m.libraries) l[name] = version;
    j["libraries"] = l;
  }
  if (!m.notes.empty()) j["notes"] = m.notes;
  return j;
}

void put_spread(json& e, const Calibration::Spread& s) {
  if (s.p10_us > 0) e["p10_us"] = s.p10_us;
  if (s.p90_us > 0) e["p90_us"] = s.p90_us;
  if (s.samples > 0) e["samples"] = s.samples;
  if (s.ranks_sharing != 1) e["ranks_sharing"] = s.ranks_sharing;
}

// Keeps, of `v`, the entries at the level chosen for `ranks` among the levels present in v.
template <class T>
std::vector<T> at_level(const std::vector<T>& v, int ranks) {
  std::vector<int> levels;
  for (const T& e : v) levels.push_back(e.spread.ranks_sharing);
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  if (levels.size() <= 1) return v;
  int pick = levels.front();
  for (int l : levels)
    if (l <= ranks) pick = l;
  std::vector<T> out;
  for (const T& e : v)
    if (e.spread.ranks_sharing == pick) out.push_back(e);
  return out;
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kBf16: return "bf16";
    case DType::kFp32: return "fp32";
    case DType::kFp8: return "fp8";
    case DType::kFp8Split: return "fp8_split";
  }
  return "fp32";
}

double gemm_flops(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

double attention_flops(int64_t bh, int64_t seq, int64_t d, bool causal) {
  const double f = 4.0 * static_cast<double>(bh) * static_cast<double>(seq) *
                   static_cast<double>(seq) * static_cast<double>(d);
  return causal ? f / 2 : f;
}

std::optional<double> Calibration::gemm_time(int64_t m, int64_t n, int64_t k, DType dtype) const {
  std::vector<Point> pts;
  for (const auto& g : gemm) {
    if (g.dtype != dtype) continue;
    if (g.m == m && g.n == n && g.k == k) return g.time_us * 1e-6;
    pts.push_back({gemm_flops(g.m, g.n, g.k), gemm_flops(g.m, g.n, g.k) / (g.time_us * 1e-6)});
  }
  return interpolate_time(std::move(pts), gemm_flops(m, n, k));
}

namespace {

std::optional<double> attention_lookup(const std::vector<Calibration::Attention>& attention,
                                       int64_t bh, int64_t seq, int64_t d, bool causal,
                                       bool backward) {
  std::vector<Point> pts;
  for (const auto& a : attention) {
    if (a.causal != causal || a.backward != backward) continue;
    if (a.batch_heads == bh && a.seq == seq && a.head_dim == d) return a.time_us * 1e-6;
    const double f = attention_flops(a.batch_heads, a.seq, a.head_dim, a.causal);
    pts.push_back({f, f / (a.time_us * 1e-6)});
  }
  return interpolate_time(std::move(pts), attention_flops(bh, seq, d, causal));
}

}  // namespace

std::optional<double> Calibration::attention_time(int64_t bh, int64_t seq, int64_t d,
                                                  bool causal) const {
  return attention_lookup(attention, bh, seq, d, causal, false);
}

std::optional<double> Calibration::attention_backward_time(int64_t bh, int64_t seq, int64_t d,
                                                           bool causal) const {
  return attention_lookup(attention, bh, seq, d, causal, true);
}

std::optional<double> Calibration::op_time(std::string_view op, double bytes) const {
  std::vector<Point> pts;
  for (const auto& o : ops) {
    if (o.op != op) continue;
    if (o.bytes == bytes) return o.time_us * 1e-6;
    pts.push_back({o.bytes, o.bytes / (o.time_us * 1e-6)});
  }
  return interpolate_time(std::move(pts), bytes);
}

std::vector<int> Calibration::sharing_levels() const {
  std::vector<int> levels;
  auto add = [&](const auto& v) {
    for (const auto& e : v) levels.push_back(e.spread.ranks_sharing);
  };
  add(gemm), add(grouped_gemm), add(attention), add(memory), add(ops), add(collectives);
  if (levels.empty()) levels.push_back(1);
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  return levels;
}

Calibration Calibration::for_ranks_sharing(int ranks) const {
  Calibration c = *this;
  c.gemm = at_level(gemm, ranks);
  c.grouped_gemm = at_level(grouped_gemm, ranks);
  c.attention = at_level(attention, ranks);
  c.memory = at_level(memory, ranks);
  c.ops = at_level(ops, ranks);
  c.collectives = at_level(collectives, ranks);
  return c;
}

Calibration Calibration::for_transport(std::string_view transport) const {
  Calibration c = *this;
  c.collectives.clear();
  for (const auto& e : collectives)
    if (e.transport.empty() || e.transport == transport) c.collectives.push_back(e);
  return c;
}

std::optional<double> Calibration::memory_time(double bytes) const {
  std::vector<Point> pts;
  for (const auto& m : memory) {
    if (m.bytes == bytes) return m.time_us * 1e-6;
    pts.push_back({m.bytes, m.bytes / (m.time_us * 1e-6)});
  }
  return interpolate_time(std::move(pts), bytes);
}

std::optional<double> Calibration::collective_busbw(CollectiveKind kind, int members,
                                                    double bytes) const {
  // Interpolating time of a "busbw-work" then converting back gives busbw.
  std::vector<Point> pts;
  for (const auto& c : collectives)
    if (c.kind == kind && c.members == members) pts.push_back({c.bytes, c.busbw_GBps * 1e9});
  auto t = interpolate_time(std::move(pts), bytes);
  if (!t) return std::nullopt;
  return bytes / *t;
}

namespace {

// Refuses a top-level field the format does not have.
Status check_top_level_fields(const json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const char* known[] = {"version", "device", "precision", "machine", "gemm", "grouped_gemm",
                                  "attention", "memory", "ops", "links", "collectives"};
    if (std::find_if(std::begin(known), std::end(known),
                     [&](const char* k) { return it.key() == k; }) == std::end(known))
      return make_error(
          "unknown calibration field '{}'; known: version, device, precision, machine, gemm, grouped_gemm, "
          "attention, memory, ops, links, collectives",
          it.key());
  }
  return ok_status();
}

// The optional fields that describe what was measured: device, precision, machine.
Status read_description(const json& j, Calibration& c) {
  if (j.contains("device")) {
    if (!j["device"].is_string()) return make_error("field 'device' must be a string");
    c.device = j["device"].get<std::string>();
  }
  // A file from before the field was written was measured in fp32 (calibration.h).
  if (j.contains("precision")) {
    const std::string p = j["precision"].is_string() ? j["precision"].get<std::string>() : "";
    if (p != "bf16" && p != "fp32")
      return make_error("field 'precision' must be \"bf16\" or \"fp32\", got {}", j["precision"].dump());
    c.precision = p == "bf16" ? DType::kBf16 : DType::kFp32;
  }
  if (j.contains("machine")) {
    MT_ASSIGN(c.machine, machine_from_json(j["machine"]));
  }
  return ok_status();
}

// The optional "dtype" of an entry of a GEMM list: bf16 when absent.
Result<DType> gemm_dtype_of(const Entry& e) {
  if (!e.value.contains("dtype")) return DType::kBf16;
  const json& dtype = e.value["dtype"];
  const std::string s = dtype.is_string() ? dtype.get<std::string>() : "";
  if (s == "fp32") return DType::kFp32;
  if (s == "fp8") return DType::kFp8;
  if (s == "fp8_split") return DType::kFp8Split;
  if (s != "bf16" && s != "fp16")
    return make_error("{}[{}]: field 'dtype' must be \"bf16\", \"fp16\", \"fp8\", \"fp8_split\" or \"fp32\", got {}",
                      e.where, e.i, dtype.dump());
  return DType::kBf16;
}

// The calibration's `gemm` entries: measured GEMM times by shape and dtype.
Status read_gemm(const json& j, Calibration& c) {
  return for_each_entry(j, "gemm", [&](const Entry& e) -> Status {
    MT_ASSIGN(int64_t m, positive_int(e, "m"));
    MT_ASSIGN(int64_t n, positive_int(e, "n"));
    MT_ASSIGN(int64_t k, positive_int(e, "k"));
    MT_ASSIGN(double us, positive(e, "time_us"));
    MT_ASSIGN(DType dt, gemm_dtype_of(e));
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.gemm.push_back({m, n, k, dt, us, sp});
    return ok_status();
  });
}

// The `grouped_gemm` entries: one grouped kernel over equal groups, forward or weight gradient.
Status read_grouped_gemm(const json& j, Calibration& c) {
  return for_each_entry(j, "grouped_gemm", [&](const Entry& e) -> Status {
    MT_ASSIGN(int64_t groups, positive_int(e, "groups"));
    MT_ASSIGN(int64_t rows, positive_int(e, "rows"));
    MT_ASSIGN(int64_t n, positive_int(e, "n"));
    MT_ASSIGN(int64_t k, positive_int(e, "k"));
    MT_ASSIGN(double us, positive(e, "time_us"));
    MT_ASSIGN(DType dt, gemm_dtype_of(e));
    MT_ASSIGN(bool wgrad, optional_bool(e, "wgrad", "true (weight gradients) or false (forward)"));
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.grouped_gemm.push_back({groups, rows, n, k, dt, us, wgrad, sp});
    return ok_status();
  });
}

// The `attention` entries: fused attention times, forward or backward.
Status read_attention(const json& j, Calibration& c) {
  return for_each_entry(j, "attention", [&](const Entry& e) -> Status {
    MT_ASSIGN(int64_t bh, positive_int(e, "batch_heads"));
    MT_ASSIGN(int64_t s, positive_int(e, "seq"));
    MT_ASSIGN(int64_t d, positive_int(e, "head_dim"));
    MT_ASSIGN(double us, positive(e, "time_us"));
    MT_ASSIGN(bool causal, optional_bool(e, "causal"));
    MT_ASSIGN(bool backward, optional_bool(e, "backward"));
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.attention.push_back({bh, s, d, causal, us, backward, sp});
    return ok_status();
  });
}

// The `memory` entries: copy times by bytes (the memory-bound roofline).
Status read_memory(const json& j, Calibration& c) {
  return for_each_entry(j, "memory", [&](const Entry& e) -> Status {
    MT_ASSIGN(double bytes, positive(e, "bytes"));
    MT_ASSIGN(double us, positive(e, "time_us"));
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.memory.push_back({bytes, us, sp});
    return ok_status();
  });
}

// The `ops` entries: memory-bound op times by op name and bytes.
Status read_ops(const json& j, Calibration& c) {
  return for_each_entry(j, "ops", [&](const Entry& e) -> Status {
    MT_TRY(need(e, "op"));
    if (!e.value["op"].is_string() || e.value["op"].get<std::string>().empty())
      return make_error("ops[{}]: field 'op' must be a backend op name, e.g. \"gelu_forward\"", e.i);
    MT_ASSIGN(double bytes, positive(e, "bytes"));
    MT_ASSIGN(double us, positive(e, "time_us"));
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.ops.push_back({e.value["op"].get<std::string>(), bytes, us, sp});
    return ok_status();
  });
}

// The `links` entries: measured link bandwidths and latencies.
Status read_links(const json& j, Calibration& c) {
  return for_each_entry(j, "links", [&](const Entry& e) -> Status {
    MT_TRY(need(e, "kind"));
    const std::string kind = e.value["kind"].is_string() ? e.value["kind"].get<std::string>() : "";
    if (kind != "nvlink" && kind != "pcie" && kind != "nic")
      return make_error("links[{}]: field 'kind' must be \"nvlink\", \"pcie\" or \"nic\", got {}",
                        e.i, e.value["kind"].dump());
    MT_ASSIGN(double gbps, positive(e, "GBps"));
    double latency = 0;
    if (e.value.contains("latency_us")) {
      MT_ASSIGN(latency, positive(e, "latency_us"));
    }
    c.links.push_back({kind, gbps, latency});
    return ok_status();
  });
}

// The `collectives` entries: bus bandwidths by kind, members and bytes.
Status read_collectives(const json& j, Calibration& c) {
  return for_each_entry(j, "collectives", [&](const Entry& e) -> Status {
    MT_TRY(need(e, "kind"));
    if (!e.value["kind"].is_string())
      return make_error("collectives[{}]: field 'kind' must be a string", e.i);
    MT_ASSIGN(CollectiveKind kind, parse_collective_kind(e.value["kind"].get<std::string>())
                                       .context(fmt::format("collectives[{}]", e.i)));
    MT_ASSIGN(int64_t members, positive_int(e, "members"));
    MT_ASSIGN(double bytes, positive(e, "bytes"));
    MT_ASSIGN(double busbw, positive(e, "busbw_GBps"));
    std::string transport;
    if (e.value.contains("transport")) {
      transport = e.value["transport"].is_string() ? e.value["transport"].get<std::string>() : "";
      if (transport != "threads" && transport != "mpi")
        return make_error(
            "collectives[{}]: field 'transport' must be \"threads\" or \"mpi\", got {}", e.i,
            e.value["transport"].dump());
    }
    MT_ASSIGN(Calibration::Spread sp, spread_of(e));
    c.collectives.push_back({kind, static_cast<int>(members), bytes, busbw, transport, sp});
    return ok_status();
  });
}
}  // namespace

Result<Calibration> calibration_from_json(std::string_view text) {
  MT_ASSIGN(const json j, parse_json(text, "calibration"));
  if (!j.is_object()) return make_error("calibration must be a JSON object {{...}}");
  MT_TRY(check_top_level_fields(j));
  if (!j.contains("version") || !j["version"].is_number_integer())
    return make_error("calibration needs an integer field 'version' (this build reads {})",
                      Calibration::kVersion);
  Calibration c;
  MT_TRY(JsonFields::of(j, "calibration field", "").value().get_int("version", IntRange{0, 1 << 20}, c.version));
  if (c.version != Calibration::kVersion)
    return make_error(
        "calibration version {} is not supported (this build reads {}); "
        "re-run the calibration",
        c.version, Calibration::kVersion);
  MT_TRY(read_description(j, c));
  MT_TRY(read_gemm(j, c));
  MT_TRY(read_grouped_gemm(j, c));
  MT_TRY(read_attention(j, c));
  MT_TRY(read_memory(j, c));
  MT_TRY(read_ops(j, c));
  MT_TRY(read_links(j, c));
  MT_TRY(read_collectives(j, c));
  return c;
}

std::string calibration_to_json(const Calibration& c) {
  // nlohmann prints doubles with enough digits to read back the same value.
  json j = json::object();
  j["version"] = c.version;
  if (!c.device.empty()) j["device"] = c.device;
  j["precision"] = dtype_name(c.precision);
  if (!c.machine.empty()) j["machine"] = machine_to_json(c.machine);
  json& g = j["gemm"] = json::array();
  for (const auto& e : c.gemm) {
    json x = {{"m", e.m},
              {"n", e.n},
              {"k", e.k},
              {"dtype", dtype_name(e.dtype)},
              {"time_us", e.time_us}};
    put_spread(x, e.spread);
    g.push_back(std::move(x));
  }
  if (!c.grouped_gemm.empty()) {  // a file without them reads and writes as before
    json& gg = j["grouped_gemm"] = json::array();
    for (const auto& e : c.grouped_gemm) {
      json x = {{"groups", e.groups}, {"rows", e.rows}, {"n", e.n}, {"k", e.k}, {"dtype", dtype_name(e.dtype)},
                {"time_us", e.time_us}};
      if (e.wgrad) x["wgrad"] = true;
      put_spread(x, e.spread);
      gg.push_back(std::move(x));
    }
  }
  json& a = j["attention"] = json::array();
  for (const auto& e : c.attention) {
    json x = {{"batch_heads", e.batch_heads},
              {"seq", e.seq},
              {"head_dim", e.head_dim},
              {"causal", e.causal},
              {"time_us", e.time_us}};
    if (e.backward) x["backward"] = true;
    put_spread(x, e.spread);
    a.push_back(std::move(x));
  }
  json& m = j["memory"] = json::array();
  for (const auto& e : c.memory) {
    json x = {{"bytes", e.bytes}, {"time_us", e.time_us}};
    put_spread(x, e.spread);
    m.push_back(std::move(x));
  }
  if (!c.ops.empty()) {
    json& o = j["ops"] = json::array();
    for (const auto& e : c.ops) {
      json x = {{"op", e.op}, {"bytes", e.bytes}, {"time_us", e.time_us}};
      put_spread(x, e.spread);
      o.push_back(std::move(x));
    }
  }
  json& l = j["links"] = json::array();
  for (const auto& e : c.links) {
    json x = {{"kind", e.kind}, {"GBps", e.GBps}};
    if (e.latency_us > 0) x["latency_us"] = e.latency_us;
    l.push_back(std::move(x));
  }
  json& k = j["collectives"] = json::array();
  for (const auto& e : c.collectives) {
    json x = {{"kind", collective_kind_name(e.kind)},
              {"members", e.members},
              {"bytes", e.bytes},
              {"busbw_GBps", e.busbw_GBps}};
    if (!e.transport.empty()) x["transport"] = e.transport;
    put_spread(x, e.spread);
    k.push_back(std::move(x));
  }
  return j.dump(2) + "\n";
}

Result<Calibration> load_calibration(const std::string& path) {
  MT_ASSIGN(const std::string text, read_input_file(path, "calibration file"));
  auto r = calibration_from_json(text);
  r.context(fmt::format("calibration file '{}'", path));
  return r;
}

Status save_calibration(const Calibration& c, const std::string& path) {
  const std::string text = calibration_to_json(c);
  // Never write a file this reader refuses (a measurement outside its ranges would only fail later,
  // in simulate or plan): the entry and the reason, now.
  if (auto back = calibration_from_json(text); !back)
    return make_error("calibration for '{}' not written: it holds a value its reader refuses ({}); this is a "
                      "bug in what produced it, please report it",
                      path, back.error().message());
  return write_output_file(path, text, "calibration file");
}

void apply_link_calibration(const Calibration& c, ClusterSpec& spec) {
  for (const auto& l : c.links) {
    if (l.kind == "nvlink") {
      spec.nvlink_bandwidth = l.GBps * 1e9;
      if (l.latency_us > 0) spec.nvlink_latency = static_cast<Time>(l.latency_us * kMicrosecond);
    }
    if (l.kind == "pcie") spec.pcie_bandwidth = l.GBps * 1e9;
    if (l.kind == "nic") spec.nic_bandwidth = l.GBps * 1e9;
  }
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool measured_on_cpu(const Calibration& c) {
  return c.machine.backend == "cpu" || lower(c.device).find("cpu backend") != std::string::npos;
}

// A device name that can only be an accelerator's (the cpu backend names the host's CPU).
bool names_accelerator(const std::string& device) {
  const std::string d = lower(device);
  for (const char* word : {"nvidia", "gpu", "a100", "h100", "h200", "b200", "v100", "l40", "instinct", "mi250", "mi300"})
    if (d.find(word) != std::string::npos) return true;
  return false;
}

// The file against itself: its machine.backend and its device must describe one machine.
Status check_backend_and_device(const Calibration& c) {
  if (c.machine.backend.empty() || c.device.empty()) return ok_status();
  const bool device_cpu = lower(c.device).find("cpu backend") != std::string::npos;
  if (c.machine.backend == "cpu" && names_accelerator(c.device))
    return make_error("the calibration's machine.backend is \"cpu\", but its device '{}' is an accelerator: the "
                      "cpu backend measures the host's CPU, so one of the two is wrong; re-run `meshtrain calibrate` "
                      "on the machine you mean to simulate", c.device);
  if (c.machine.backend == "cuda" && device_cpu)
    return make_error("the calibration's machine.backend is \"cuda\", but its device '{}' is the cpu backend's; one "
                      "of the two is wrong; re-run `meshtrain calibrate` on the machine you mean to simulate", c.device);
  return ok_status();
}

}  // namespace

Status check_calibration_device(const Calibration& c, const ClusterSpec& cluster) {
  if (c.device.empty() && c.machine.backend.empty()) return ok_status();
  MT_TRY(check_backend_and_device(c));
  const std::string device = lower(cluster.device.name);
  const bool cluster_cpu = device.find("cpu") != std::string::npos;
  const std::string measured = c.device.empty() ? c.machine.backend + " backend" : c.device;
  if (measured_on_cpu(c) != cluster_cpu) {
    // The backend decides: a cpu-backend file holds a CPU's times whatever its device says, and the reverse.
    const std::string backend = measured_on_cpu(c) ? "cpu" : "cuda";
    return make_error("the calibration was measured by the {} backend (on '{}'), but cluster '{}' has {} devices "
                      "('{}'): its times are another backend's; calibrate with the backend of that cluster, or "
                      "simulate a cluster of the measured machine ({})",
                      backend, measured, cluster.name, cluster_cpu ? "cpu" : "GPU", cluster.device.name,
                      measured_on_cpu(c) ? "--cluster local-cpu for a cpu-backend calibration"
                                         : "a GPU preset such as dgx-a100, dgx-h100 or h200");
  }
  if (cluster_cpu || c.device.empty()) return ok_status();
  // The family is the device name's first word: "a100" of "A100-SXM4-80GB".
  const std::string family = device.substr(0, device.find_first_of("- _"));
  const std::string cal_device = lower(c.device);
  if (cal_device.find(family) == std::string::npos && device.find(cal_device) == std::string::npos)
    return make_error("the calibration was measured on '{}', but cluster '{}' has '{}' devices; its times would "
                      "be another machine's: calibrate on that device, simulate a cluster of the measured one, or "
                      "describe the measured device in a cluster file (\"base\": \"{}\", \"device\": "
                      "{{\"name\": \"{}\"}})",
                      measured, cluster.name, cluster.device.name, cluster.name, measured);
  return ok_status();
}

Status check_calibration_precision(const Calibration& c, DType run) {
  if (c.precision == run) return ok_status();
  return make_error("the calibration was measured at precision {} but the run is {}: its attention and "
                    "memory-bound times are another dtype's; re-run `meshtrain calibrate --precision {} ...` "
                    "(or simulate with --precision {})",
                    dtype_name(c.precision), dtype_name(run), dtype_name(run), dtype_name(c.precision));
}

CalibrationCoverage calibration_coverage(const Calibration& c, DType dtype) {
  CalibrationCoverage out;
  auto add = [&](bool measured, std::string what) { (measured ? out.measured : out.defaults).push_back(std::move(what)); };
  // An fp8 run's backward GEMMs are the split accumulator's (DType::kFp8Split).
  std::vector<DType> gemm_dtypes{dtype};
  if (dtype == DType::kFp8) gemm_dtypes.push_back(DType::kFp8Split);
  for (const DType d : gemm_dtypes) {
    std::size_t gemms = 0;
    for (const auto& g : c.gemm) gemms += g.dtype == d;
    add(gemms > 0, fmt::format("gemm {}{}", dtype_name(d), gemms ? fmt::format(" ({} shapes)", gemms) : ""));
    std::size_t grouped = 0;
    for (const auto& g : c.grouped_gemm) grouped += g.dtype == d;
    add(grouped > 0, fmt::format("grouped gemm {}{}", dtype_name(d),
                                 grouped ? fmt::format(" ({} shapes)", grouped) : " (tile model)"));
  }
  for (bool backward : {false, true}) {
    const bool any = std::any_of(c.attention.begin(), c.attention.end(),
                                 [&](const Calibration::Attention& a) { return a.backward == backward; });
    add(any, backward ? "attention backward" : "attention forward");
  }
  add(!c.memory.empty() || !c.ops.empty(),
      c.ops.empty() ? "memory-bound ops" : fmt::format("memory-bound ops ({} measured by name)", [&] {
        std::vector<std::string> names;
        for (const auto& o : c.ops) names.push_back(o.op);
        std::sort(names.begin(), names.end());
        return static_cast<std::size_t>(std::unique(names.begin(), names.end()) - names.begin());
      }()));
  for (const char* kind : {"nvlink", "pcie", "nic"}) {
    const bool any = std::any_of(c.links.begin(), c.links.end(), [&](const Calibration::Link& l) { return l.kind == kind; });
    add(any, fmt::format("link {}", kind));
  }
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    const bool any = std::any_of(c.collectives.begin(), c.collectives.end(),
                                 [&](const Calibration::Collective& e) { return e.kind == kind; });
    add(any, fmt::format("collective {}", collective_kind_name(kind)));
  }
  return out;
}

}  // namespace meshtrain::sim
