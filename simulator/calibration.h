// Measured kernel times and bandwidths that replace the cost model's
// defaults where present (written by `meshtrain calibrate`, read by the
// simulator).
//
// File format (JSON; unknown fields are errors; every list is optional):
//
//   {
//     "version": 1,                       // required; this reader knows version 1
//     "device": "A100-SXM4-80GB",         // optional, informative
//     "gemm": [                           // C(m×n) = A(m×k)·B(k×n), one kernel
//       {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "time_us": 510.2}],
//     "attention": [                      // fused attention forward
//       {"batch_heads": 256, "seq": 2048, "head_dim": 128, "causal": true, "time_us": 1830}],
//     "memory": [                         // memory-bound kernels by bytes moved (read + write)
//       {"bytes": 67108864, "time_us": 41.5}],
//     "links": [                          // measured one-direction bandwidth per link kind
//       {"kind": "nvlink", "GBps": 270}], //   kind: "nvlink" | "pcie" | "nic"
//     "collectives": [                    // nccl-tests bus bandwidth
//       {"kind": "all_reduce", "members": 8, "bytes": 1073741824, "busbw_GBps": 230}]
//   }
//
// Interpolation between measured shapes: entries of the same kind (and
// dtype; collectives: same kind and member count) are ordered by work
// (FLOPs, or bytes); a query's achieved throughput (FLOP/s, bytes/s) is
// piecewise linear in log(work) between its two neighbours and constant
// beyond the ends; time = work / throughput. An exact shape match returns
// the measured time. Throughput rather than time is interpolated because it
// varies slowly with size while time spans orders of magnitude.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "simulator/cluster_spec.h"
#include "simulator/collective.h"

namespace meshtrain::sim {

enum class DType : uint8_t { kBf16, kFp32 };  // fp16 costs as bf16
const char* dtype_name(DType d);

struct Calibration {
  static constexpr int kVersion = 1;
  // Fields hold the file's units so that write -> read is exact.
  struct Gemm {
    int64_t m, n, k;
    DType dtype;
    double time_us;
  };
  struct Attention {
    int64_t batch_heads, seq, head_dim;
    bool causal;
    double time_us;
  };
  struct Memory {
    double bytes;
    double time_us;
  };
  struct Link {
    std::string kind;
    double GBps;
  };
  struct Collective {
    CollectiveKind kind;
    int members;
    double bytes;
    double busbw_GBps;
  };

  int version = kVersion;
  std::string device;
  std::vector<Gemm> gemm;
  std::vector<Attention> attention;
  std::vector<Memory> memory;
  std::vector<Link> links;
  std::vector<Collective> collectives;

  // Interpolated times in seconds; nullopt when nothing of that kind was measured.
  std::optional<double> gemm_time(int64_t m, int64_t n, int64_t k, DType dtype) const;
  std::optional<double> attention_time(int64_t batch_heads, int64_t seq, int64_t head_dim,
                                       bool causal) const;
  std::optional<double> memory_time(double bytes) const;
  // Interpolated bus bandwidth (bytes/s) for `members` ranks.
  std::optional<double> collective_busbw(CollectiveKind kind, int members, double bytes) const;
};

// FLOPs the calibration counts for a shape (2mnk; attention 4·bh·s²·d, half when causal).
double gemm_flops(int64_t m, int64_t n, int64_t k);
double attention_flops(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal);

Result<Calibration> calibration_from_json(std::string_view text);
std::string calibration_to_json(const Calibration& calibration);
Result<Calibration> load_calibration(const std::string& path);
Status save_calibration(const Calibration& calibration, const std::string& path);

// Replaces the spec's link bandwidths by measured ones where present.
void apply_link_calibration(const Calibration& calibration, ClusterSpec& spec);

}  // namespace meshtrain::sim
