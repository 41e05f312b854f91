#include "simulator/cluster_spec.h"

#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "core/json_input.h"

namespace meshtrain::sim {
namespace {

constexpr double kGB = 1e9;
constexpr double kGbit = 1e9 / 8;
constexpr double kTera = 1e12;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ClusterSpec dgx_h100() {
  ClusterSpec s;
  s.name = "dgx-h100";
  s.gpus_per_node = 8;
  s.gpus_per_pcie_switch = 2;
  s.nvlink_bandwidth = 450 * kGB;
  s.pcie_bandwidth = 64 * kGB;
  s.nic_bandwidth = 400 * kGbit;
  s.nodes_per_leaf = 32;
  s.spines = 32;
  s.oversubscription = 1.0;
  s.nvlink_latency = 250 * kNanosecond;
  s.pcie_latency = 250 * kNanosecond;
  s.nic_latency = 600 * kNanosecond;
  s.switch_latency = 300 * kNanosecond;
  s.nvlink_sharp = true;
  s.device = {"H100-SXM5-80GB", 989 * kTera, 67 * kTera, 80 * kGiB, 3.35e12, 1979 * kTera, 132};
  return s;
}

ClusterSpec dgx_a100() {
  ClusterSpec s = dgx_h100();
  s.name = "dgx-a100";
  s.nvlink_bandwidth = 300 * kGB;
  s.pcie_bandwidth = 32 * kGB;
  s.nic_bandwidth = 200 * kGbit;
  s.nodes_per_leaf = 20;
  s.spines = 20;
  s.nvlink_sharp = false;  // second-generation NVSwitch: no in-switch reduction
  s.device = {"A100-SXM4-80GB", 312 * kTera, 19.5 * kTera, 80 * kGiB, 2.039e12, 0, 108};
  return s;
}

ClusterSpec h200() {
  ClusterSpec s = dgx_h100();
  s.name = "h200";
  s.device = {"H200-SXM-141GB", 989 * kTera, 67 * kTera, 141e9, 4.8e12, 1979 * kTera, 132};
  return s;
}

// local-cpu: this machine running the cpu backend, ranks as threads (see cluster_spec.h).
ClusterSpec local_cpu() {
  ClusterSpec s;
  s.name = "local-cpu";
  s.gpus_per_node = 8;  // rank slots of the one machine
  s.gpus_per_pcie_switch = 2;
  s.nvlink_bandwidth = 8 * kGB;  // the in-process communicator: memcpy between rank threads
  s.pcie_bandwidth = 8 * kGB;
  s.nic_bandwidth = 8 * kGB;
  s.nodes_per_leaf = 32;
  s.spines = 1;
  s.nvlink_latency = 10 * kMicrosecond;  // a condition-variable hand-off between threads
  s.pcie_latency = 0;
  s.nic_latency = 0;
  s.switch_latency = 0;
  // 2 cores x 2.6 GHz x 32 fp32 FLOP/cycle (two 8-wide FMA), no bf16 units.
  s.device = {"local-cpu", 166e9, 166e9, 24 * kGiB, 20 * kGB};
  return s;
}

using nlohmann::json;

// A cluster file's fields, bounded (core/bounded.h): far beyond any real
// machine, far from where a time in picoseconds or a byte count overflows.
constexpr RealRange kBandwidthRange{1e-3, 1e7};  // GB/s or Gb/s
constexpr RealRange kFlopsRange{1e-3, 1e7};      // TFLOP/s
constexpr RealRange kFp8FlopsRange{0, 1e7};      // TFLOP/s; 0: no FP8 units
constexpr RealRange kMemoryRange{1e-3, 1e7};     // GiB
constexpr RealRange kLatencyRange{0, 1e9};       // ns (one second)
constexpr RealRange kOversubscriptionRange{1, 1e3};

JsonFields fields_of(const json& obj) { return JsonFields::of(obj, "field", "").value(); }

// Reads optional field `key` of `obj` into `out` scaled by `unit`; errors name
// the field, its range and the expected form.
Status read_number(const json& obj, const char* key, double unit, const RealRange& range, double& out,
                   const char* what) {
  double v = 0;
  if (!obj.contains(key)) return ok_status();
  if (Status s = fields_of(obj).get_real(key, range, v); !s.ok())
    return make_error("{} ({})", s.error().message(), what);
  out = v * unit;
  return ok_status();
}

Status read_int(const json& obj, const char* key, int min, int& out, const char* what) {
  if (Status s = fields_of(obj).get_int(key, IntRange{min, 1'000'000}, out); !s.ok())
    return make_error("{} ({})", s.error().message(), what);
  return ok_status();
}

Status read_latency(const json& obj, const char* key, Time& out) {
  double ns = 0;
  if (!obj.contains(key)) return ok_status();
  MT_TRY(read_number(obj, key, 1, kLatencyRange, ns, "nanoseconds, e.g. 300"));
  out = static_cast<Time>(ns * kNanosecond + 0.5);
  return ok_status();
}

Status check_known(const json& obj, const std::vector<std::string>& known, const char* where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool found = false;
    for (const auto& k : known) found = found || k == it.key();
    if (!found) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return make_error("unknown field '{}' in {}; known fields: {}", it.key(), where, list);
    }
  }
  return ok_status();
}

const std::vector<std::string> kTopFields = {"base",
                                             "name",
                                             "gpus_per_node",
                                             "gpus_per_pcie_switch",
                                             "nvlink_GBps",
                                             "pcie_GBps",
                                             "nic_Gbps",
                                             "nodes_per_leaf",
                                             "spines",
                                             "oversubscription",
                                             "nvlink_latency_ns",
                                             "pcie_latency_ns",
                                             "nic_latency_ns",
                                             "switch_latency_ns",
                                             "nvlink_sharp",
                                             "device"};
const std::vector<std::string> kDeviceFields = {"name",       "bf16_TFLOPS", "fp32_TFLOPS",
                                                "memory_GiB", "memory_GBps", "fp8_TFLOPS", "sms"};
// Fields that must be given when there is no "base" preset to inherit from.
const std::vector<std::string> kRequiredWithoutBase = {
    "gpus_per_node", "nvlink_GBps", "pcie_GBps", "nic_Gbps", "nodes_per_leaf", "device"};
const std::vector<std::string> kRequiredDeviceWithoutBase = {"bf16_TFLOPS", "fp32_TFLOPS",
                                                             "memory_GiB", "memory_GBps"};

}  // namespace

const std::vector<std::string>& cluster_preset_names() {
  static const std::vector<std::string> names = {"dgx-a100", "dgx-h100", "h200", "local-cpu"};
  return names;
}

Result<ClusterSpec> cluster_preset(std::string_view name) {
  if (name == "dgx-a100") return dgx_a100();
  if (name == "dgx-h100") return dgx_h100();
  if (name == "h200") return h200();
  if (name == "local-cpu") return local_cpu();
  return make_error(
      "unknown cluster preset '{}'; known presets: dgx-a100, dgx-h100, h200, local-cpu", name);
}

Status validate(const ClusterSpec& s) {
  if (s.gpus_per_node < 1) return make_error("gpus_per_node must be >= 1, got {}", s.gpus_per_node);
  if (s.gpus_per_pcie_switch < 1 || s.gpus_per_node % s.gpus_per_pcie_switch != 0)
    return make_error("gpus_per_pcie_switch ({}) must be >= 1 and divide gpus_per_node ({})",
                      s.gpus_per_pcie_switch, s.gpus_per_node);
  if (!(s.nvlink_bandwidth > 0) || !(s.pcie_bandwidth > 0) || !(s.nic_bandwidth > 0))
    return make_error("link bandwidths must be > 0 (nvlink {}, pcie {}, nic {} bytes/s)",
                      s.nvlink_bandwidth, s.pcie_bandwidth, s.nic_bandwidth);
  if (s.nodes_per_leaf < 1)
    return make_error("nodes_per_leaf must be >= 1, got {}", s.nodes_per_leaf);
  if (s.spines < 0) return make_error("spines must be >= 0, got {}", s.spines);
  if (!(s.oversubscription >= 1.0))
    return make_error("oversubscription must be >= 1 (1 = non-blocking), got {}",
                      s.oversubscription);
  if (s.nvlink_latency < 0 || s.pcie_latency < 0 || s.nic_latency < 0 || s.switch_latency < 0)
    return make_error("latencies must be >= 0");
  const DeviceSpec& d = s.device;
  if (!(d.peak_bf16_flops > 0) || !(d.peak_fp32_flops > 0) || !(d.memory_bytes > 0) ||
      !(d.memory_bandwidth > 0))
    return make_error("device '{}': bf16/fp32 FLOP/s, memory and memory bandwidth must be > 0",
                      d.name);
  return ok_status();
}

Result<ClusterSpec> cluster_spec_from_json(std::string_view text) {
  MT_ASSIGN(const json j, parse_json(text, "cluster JSON"));
  if (!j.is_object())
    return make_error("cluster JSON must be an object {{...}}, got {}", j.type_name());
  MT_TRY(check_known(j, kTopFields, "cluster"));

  ClusterSpec s;
  bool has_base = j.contains("base");
  if (has_base) {
    if (!j["base"].is_string())
      return make_error("field 'base' must be a preset name string, e.g. \"dgx-a100\"");
    MT_ASSIGN(s, cluster_preset(j["base"].get<std::string>()).context("field 'base'"));
  } else {
    for (const auto& k : kRequiredWithoutBase)
      if (!j.contains(k))
        return make_error(
            "missing field '{}'; give it or set \"base\" to a preset (dgx-a100, "
            "dgx-h100, h200) to inherit it",
            k);
    s.name = "custom";
  }
  if (j.contains("name")) {
    if (!j["name"].is_string()) return make_error("field 'name' must be a string");
    s.name = j["name"].get<std::string>();
  }
  MT_TRY(read_int(j, "gpus_per_node", 1, s.gpus_per_node, "GPUs per node, e.g. 8"));
  MT_TRY(read_int(j, "gpus_per_pcie_switch", 1, s.gpus_per_pcie_switch, "e.g. 2"));
  MT_TRY(read_number(j, "nvlink_GBps", kGB, kBandwidthRange, s.nvlink_bandwidth,
                     "GB/s per GPU per direction, e.g. 300"));
  MT_TRY(read_number(j, "pcie_GBps", kGB, kBandwidthRange, s.pcie_bandwidth, "GB/s per direction, e.g. 32"));
  MT_TRY(read_number(j, "nic_Gbps", kGbit, kBandwidthRange, s.nic_bandwidth, "Gb/s line rate, e.g. 200"));
  MT_TRY(read_int(j, "nodes_per_leaf", 1, s.nodes_per_leaf, "nodes per leaf switch, e.g. 20"));
  MT_TRY(read_int(j, "spines", 0, s.spines, "spine switches, 0 = nodes_per_leaf"));
  MT_TRY(read_number(j, "oversubscription", 1.0, kOversubscriptionRange, s.oversubscription,
                     "1 = non-blocking; 2: uplinks carry half the downlink bandwidth"));
  MT_TRY(read_latency(j, "nvlink_latency_ns", s.nvlink_latency));
  MT_TRY(read_latency(j, "pcie_latency_ns", s.pcie_latency));
  MT_TRY(read_latency(j, "nic_latency_ns", s.nic_latency));
  MT_TRY(read_latency(j, "switch_latency_ns", s.switch_latency));
  if (j.contains("nvlink_sharp"))
    if (Status st = fields_of(j).get_bool("nvlink_sharp", s.nvlink_sharp); !st.ok())
      return make_error("{} (whether the NVSwitches reduce and multicast, NCCL's NVLS: true on DGX H100)",
                        st.error().message());

  if (j.contains("device")) {
    const json& d = j["device"];
    if (!d.is_object())
      return make_error("field 'device' must be an object {{\"bf16_TFLOPS\": ...}}");
    MT_TRY(check_known(d, kDeviceFields, "device"));
    if (!has_base)
      for (const auto& k : kRequiredDeviceWithoutBase)
        if (!d.contains(k)) return make_error("missing field 'device.{}'", k);
    if (d.contains("name")) {
      if (!d["name"].is_string()) return make_error("field 'device.name' must be a string");
      s.device.name = d["name"].get<std::string>();
    }
    Status st = read_number(d, "bf16_TFLOPS", kTera, kFlopsRange, s.device.peak_bf16_flops,
                            "dense bf16 TFLOP/s, e.g. 312");
    if (st.ok())
      st = read_number(d, "fp32_TFLOPS", kTera, kFlopsRange, s.device.peak_fp32_flops, "TFLOP/s, e.g. 19.5");
    if (st.ok()) st = read_number(d, "memory_GiB", kGiB, kMemoryRange, s.device.memory_bytes, "GiB, e.g. 80");
    if (st.ok())
      st = read_number(d, "memory_GBps", kGB, kBandwidthRange, s.device.memory_bandwidth, "GB/s, e.g. 2039");
    if (st.ok())
      st = read_number(d, "fp8_TFLOPS", kTera, kFp8FlopsRange, s.device.peak_fp8_flops,
                       "dense FP8 TFLOP/s, e.g. 1979; 0: no FP8 units");
    if (st.ok() && d.contains("sms")) st = read_int(d, "sms", 0, s.device.sm_count, "streaming multiprocessors, e.g. 132");
    MT_TRY(st.context("device"));
  }
  MT_TRY(validate(s));
  return s;
}

Result<ClusterSpec> load_cluster_spec(const std::string& path) {
  MT_ASSIGN(const std::string text, read_input_file(path, "cluster file"));
  auto r = cluster_spec_from_json(text);
  r.context(fmt::format("cluster file '{}'", path));
  return r;
}

Result<ClusterSpec> cluster_spec_by_name_or_file(const std::string& name_or_path) {
  for (const auto& n : cluster_preset_names())
    if (n == name_or_path) return cluster_preset(n);
  if (name_or_path.find(".json") == std::string::npos &&
      name_or_path.find('/') == std::string::npos)
    return make_error(
        "'{}' is neither a cluster preset (dgx-a100, dgx-h100, h200, local-cpu) nor a .json file",
        name_or_path);
  return load_cluster_spec(name_or_path);
}

}  // namespace meshtrain::sim
