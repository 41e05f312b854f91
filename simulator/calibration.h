// Measured kernel times and bandwidths that replace the cost model's
// defaults where present (written by `meshtrain calibrate`, read by the
// simulator).
//
// File format (JSON; unknown fields are errors; every list is optional):
//
//   {
//     "version": 1,                       // required; this reader knows version 1
//     "device": "A100-SXM4-80GB",         // optional, informative
//     "precision": "bf16",                // the run precision it was measured at: "bf16" | "fp32"
//     "gemm": [                           // C(m×n) = A(m×k)·B(k×n), one kernel
//       {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "time_us": 510.2}],
//                                         // dtype "fp8": FP8 operands, for a run at precision fp8
//                                         // (its file's "precision" is "bf16": attention and the
//                                         // other ops of such a run are bf16); "fp8_split": the
//                                         // same with the split accumulator (DType::kFp8Split)
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
// Optional additions (all version 1; a file without them reads as before):
//
//   "machine": {                          // what was measured, informative
//     "backend": "cpu", "cpu": "AMD EPYC 7B13", "cores": 2, "date": "2026-12-02T14:00:00Z",
//     "libraries": {"OpenBLAS": "0.3.21", "oneTBB": "2021.8.0", "Open MPI": "4.1.4"},
//     "notes": ["mpi: not measured (not launched by mpirun)"]},
//   "ops": [                              // memory-bound kernels by name and bytes moved
//     {"op": "gelu_forward", "bytes": 1048576, "time_us": 210}],
//   "grouped_gemm": [                     // one grouped kernel over `groups` equal groups (MoE
//     {"groups": 8, "rows": 256,          // experts over their tokens): c_g (rows×n) = a_g (rows×k)·b_g (k×n);
//      "n": 768, "k": 2048, "dtype": "bf16", "time_us": 310.5},
//     {"groups": 8, "rows": 256, "n": 768, "k": 2048, "wgrad": true, ...}],
//                                         // "wgrad": true: the weight gradients dW_g (k×n) = a_gᵀ·d_g,
//                                         // each reduced over the group's `rows` tokens
//
// and, on any entry of gemm / attention / memory / ops / collectives:
//   "p10_us", "p90_us"  the spread of the measured samples (time_us is their median;
//                       collectives: of the time of one call), "samples" how many;
//   "ranks_sharing"     how many ranks ran the same op at once on the measured
//                       machine (default 1). A cpu machine whose cores are shared
//                       by rank threads is measured at several levels;
//                       for_ranks_sharing() picks the level a simulation needs.
// attention entries take "backward": true for the fused backward (default
// false: forward); links take "latency_us" (one-way small-message latency);
// collectives take "transport": "threads" or "mpi" (default "" = unspecified,
// e.g. NCCL), and kind "send_recv" for point-to-point bandwidth (busbw =
// algbw = bytes / time).
//
// "precision" is the precision of the runs the file stands for: its GEMMs,
// attention and memory-bound ops were measured on tensors of that dtype
// (attention and "ops" entries carry no dtype of their own), so a simulation
// at another precision must not use it (apply_calibration refuses it). Files
// written before the field existed were all measured in fp32 (calibrate only
// built fp32 tensors), so a file without it reads as fp32.
//
// Op names of "ops" are the backend.h method names as the sim backend
// issues them (add, copy, layernorm_forward, adamw, ...); bytes are counted
// as the sim backend counts them (each tensor argument read or written once).
//
// Grouped GEMMs (grouped_gemm_time): the entries of the query's dtype and
// kind (forward or wgrad) at the measured (n, k) nearest the query's (in log
// n + log k) when that is within a factor of 2 of the query's n and of its k
// (else none: the cost model keeps its tile model for a shape not measured),
// and of those the group count nearest the query's non-empty
// groups (in log; a tie takes the larger), give a per-group throughput over
// rows per group: the measured time's FLOPs over it, piecewise linear in
// log(rows) between neighbours and constant beyond the ends, as below. A
// group of the query costs its own FLOPs at the throughput of its own rows,
// and the kernel the sum over its groups: uneven groups cost what each one's
// rows cost (a group of 4096 rows more than one of 16), empty ones nothing.
// For even groups at a measured entry's shape that sum is its time_us.
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

// fp16 costs as bf16. kFp8: a GEMM with FP8 (E4M3/E5M2) operands and bf16
// output, as a plan with precision fp8 runs its linear layers' forward
// GEMMs, accumulating in the tensor cores' fast (reduced-precision)
// accumulator; kFp8Split: the same with the split accumulator, whose partial
// sums are promoted to fp32 as K advances (cuBLASLt without
// CUBLASLT_MATMUL_DESC_FAST_ACCUM), as Transformer Engine runs a linear's dgrad
// and wgrad GEMMs (TE 1.x _2X_ACC_DGRAD/_2X_ACC_WGRAD; TE 2.x recipes'
// fp8_gemm_dgrad/fp8_gemm_wgrad MMParams(use_split_accumulator=True)). Only
// GEMMs have them (attention and memory-bound ops of such a run are bf16).
// Without a measurement the two cost alike: no public H100 table gives the
// split accumulator's cost, so `meshtrain calibrate` measures both.
enum class DType : uint8_t { kBf16, kFp32, kFp8, kFp8Split };
const char* dtype_name(DType d);

struct Calibration {
  static constexpr int kVersion = 1;
  // Fields hold the file's units so that write -> read is exact.
  // The spread of an entry's samples; zero when not recorded. Trailing on
  // every entry so that the brace-initialised forms of version 1 still work.
  struct Spread {
    double p10_us = 0, p90_us = 0;
    int samples = 0;
    int ranks_sharing = 1;
  };
  struct Gemm {
    int64_t m, n, k;
    DType dtype;
    double time_us;
    Spread spread = {};
  };
  struct GroupedGemm {
    int64_t groups, rows, n, k;
    DType dtype;
    double time_us;
    bool wgrad = false;
    Spread spread = {};
  };
  struct Attention {
    int64_t batch_heads, seq, head_dim;
    bool causal;
    double time_us;
    bool backward = false;
    Spread spread = {};
  };
  struct Memory {
    double bytes;
    double time_us;
    Spread spread = {};
  };
  struct Op {
    std::string op;
    double bytes;
    double time_us;
    Spread spread = {};
  };
  struct Link {
    std::string kind;
    double GBps;
    double latency_us = 0;  // 0: not measured
  };
  struct Collective {
    CollectiveKind kind;
    int members;
    double bytes;
    double busbw_GBps;
    std::string transport = {};  // "threads", "mpi" or "" (unspecified)
    Spread spread = {};
  };
  struct Machine {
    std::string backend, cpu, date;
    int cores = 0;
    std::vector<std::pair<std::string, std::string>> libraries;  // (name, version), file order
    std::vector<std::string> notes;
    bool empty() const {
      return backend.empty() && cpu.empty() && date.empty() && cores == 0 && libraries.empty() &&
             notes.empty();
    }
  };

  int version = kVersion;
  std::string device;
  DType precision = DType::kFp32;  // absent from the file: fp32 (see the format above)
  Machine machine;
  std::vector<Gemm> gemm;
  std::vector<GroupedGemm> grouped_gemm;
  std::vector<Attention> attention;
  std::vector<Memory> memory;
  std::vector<Op> ops;
  std::vector<Link> links;
  std::vector<Collective> collectives;

  // Interpolated times in seconds; nullopt when nothing of that kind was measured.
  std::optional<double> gemm_time(int64_t m, int64_t n, int64_t k, DType dtype) const;
  // One grouped GEMM over groups of rows[g] (forward and input gradient: rows
  // × k by k × n; wgrad: the (k × n) weight gradient reduced over rows[g]
  // tokens), from the grouped_gemm entries as described above; nullopt when
  // none of that dtype and kind was measured near (n, k).
  std::optional<double> grouped_gemm_time(const std::vector<int64_t>& rows, int64_t n, int64_t k, DType dtype,
                                          bool wgrad) const;
  // Forward entries only; attention_backward_time reads the "backward" ones.
  std::optional<double> attention_time(int64_t batch_heads, int64_t seq, int64_t head_dim,
                                       bool causal) const;
  std::optional<double> attention_backward_time(int64_t batch_heads, int64_t seq,
                                                int64_t head_dim, bool causal) const;
  std::optional<double> memory_time(double bytes) const;
  // The "ops" entries of `op` (nullopt when that op was not measured).
  std::optional<double> op_time(std::string_view op, double bytes) const;
  // Interpolated bus bandwidth (bytes/s) for `members` ranks.
  std::optional<double> collective_busbw(CollectiveKind kind, int members, double bytes) const;

  // The measured sharing levels (ranks_sharing values), ascending; {1} when none recorded.
  std::vector<int> sharing_levels() const;
  // A copy holding, of each table, only the entries measured at the level
  // that fits `ranks` ranks sharing one machine: the largest measured level
  // <= ranks (the smallest level when all are larger). A table measured at
  // one level only is kept whole, so a version-1 file is unchanged.
  Calibration for_ranks_sharing(int ranks) const;
  // A copy without the collectives of other transports (entries with no
  // transport are kept).
  Calibration for_transport(std::string_view transport) const;
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

// An Error naming both devices when the calibration was plainly measured on
// another kind of device than the cluster's: a cpu-backend calibration on a
// GPU cluster or the reverse, or a GPU calibration whose device does not name
// the cluster device's family ("A100" for "A100-SXM4-80GB"). A calibration
// that names no device passes (there is nothing to compare).
Status check_calibration_device(const Calibration& calibration, const ClusterSpec& cluster);

// An Error naming both precisions and the command that makes a matching
// calibration when `calibration` was measured at another precision than the
// simulated run's `run`: its attention and memory-bound times are those of
// another dtype (a bf16 step simulated with fp32 attention was 6-9x too slow).
Status check_calibration_precision(const Calibration& calibration, DType run);

// Which of the simulator's tables a simulation at `dtype` takes from the
// calibration and which from the cost model's defaults, as two lists:
// {"gemm bf16 (12 shapes)", "collectives all_reduce", ...}.
struct CalibrationCoverage {
  std::vector<std::string> measured, defaults;
};
CalibrationCoverage calibration_coverage(const Calibration& calibration, DType dtype);

}  // namespace meshtrain::sim
