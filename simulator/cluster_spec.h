// What a cluster is made of: the device in each slot and the links between
// them, as numbers with their sources. `Cluster` (topology.h) builds the
// graph from a ClusterSpec and a GPU count.
//
// Shape every spec describes (rail-optimized two-level fat tree, as in the
// NVIDIA DGX SuperPOD reference architectures):
//
//   node:  GPU ──NVLink── NVSwitch fabric (one switch vertex per node)
//          GPU ──PCIe── PCIe switch ──PCIe── NIC   (one NIC per GPU: a "rail")
//   net:   NIC of rail r on a node of group g ── leaf (g, r)
//          every leaf ── every spine
//
// A group is `nodes_per_leaf` consecutive nodes. Leaf->spine bandwidth is
// the leaf's downlink bandwidth divided by `oversubscription`, spread evenly
// over `spines` uplinks. Real clusters past a few thousand GPUs add a third
// tier; we keep two and let the spine count grow, which has the same
// bisection bandwidth (documented simplification).
//
// Presets (bandwidths per direction unless said; 1 GB = 1e9 bytes):
//
// | preset   | device         | bf16 dense | fp8 dense  | fp32      | memory       | HBM bw     |
// |----------|----------------|------------|------------|-----------|--------------|------------|
// | dgx-a100 | A100-SXM4-80GB | 312 TF/s   | none       | 19.5 TF/s | 80 GiB HBM2e | 2.039 TB/s |
// | dgx-h100 | H100-SXM5-80GB | 989 TF/s   | 1979 TF/s  | 67 TF/s   | 80 GiB HBM3  | 3.35 TB/s  |
// | h200     | H200-SXM-141GB | 989 TF/s   | 1979 TF/s  | 67 TF/s   | 141 GB HBM3e | 4.8 TB/s   |
// (FP8 dense peaks: NVIDIA H100/H200 datasheets, 3958 TF/s with sparsity.)
//
// | preset   | NVLink per GPU          | NIC per GPU  | PCIe         | nodes/leaf, spines    |
// |----------|-------------------------|--------------|--------------|-----------------------|
// | dgx-a100 | 300 GB/s (NVL3, 600 bi) | 200 Gb/s HDR | 32 GB/s Gen4 | 20, 20 (QM8790 40-p)  |
// | dgx-h100 | 450 GB/s (NVL4, 900 bi) | 400 Gb/s NDR | 64 GB/s Gen5 | 32, 32 (QM9700 64-p)  |
// | h200     | 450 GB/s (NVL4, 900 bi) | 400 Gb/s NDR | 64 GB/s Gen5 | 32, 32                |
//
// local-cpu: the machine the cpu backend runs on, ranks as threads of one
// process. Every rank is a "GPU" slot of a node of 8 (a plan of up to 8
// ranks is one node, no network); "NVLink" stands for the in-process
// communicator (memcpy between rank threads, 8 GB/s, 10 µs per hand-off), and
// PCIe and NIC get the same memcpy bandwidth, so a plan of more than 8 ranks
// still communicates at memory speed. The device defaults describe a 2-core 2.6 GHz AVX2/AVX-512 VM
// (166 GFLOP/s fp32 peak, the same for bf16: no bf16 units; 24 GiB; 20 GB/s)
// and are fallbacks only: `meshtrain calibrate --backend cpu` measures the
// kernels, the link and the collectives, and the cores that ranks share: a
// plan of k rank threads gives each cores/k threads (`meshtrain train`, cpu
// backend), calibrate measures each level k the same way, and simulate picks
// the measured ranks_sharing level for the plan's ranks per node.
//
// NVLink SHARP: dgx-h100 and h200 (third-generation NVSwitch), not dgx-a100.
//
// Hop latencies (dgx-a100, dgx-h100, h200): NVLink 250 ns, PCIe 250 ns, NIC<->leaf 600 ns,
// leaf<->spine 300 ns.
//
// Sources: NVIDIA A100 datasheet (2021) and "NVIDIA A100 Tensor Core GPU
// Architecture" whitepaper; NVIDIA H100 datasheet and "NVIDIA H100 Tensor
// Core GPU Architecture" whitepaper (SXM5 figures, dense = half the sparse
// number); NVIDIA H200 datasheet (141 GB, 4.8 TB/s); DGX A100 and DGX H100
// user guides (8 single-port ConnectX-6 / ConnectX-7 compute NICs);
// "NVIDIA DGX SuperPOD: Reference Architecture" for DGX A100 (20-node
// scalable units, HDR QM8790 leaves) and DGX H100 (32-node SUs, NDR QM9700).
// Latencies are estimates of one hop's wire + switch time (InfiniBand switch
// port-to-port ~130-200 ns, NVSwitch hop a few hundred ns); software
// overhead per collective step lives in CostConstants::collective_alpha.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "simulator/event_queue.h"

namespace meshtrain::sim {

struct DeviceSpec {
  std::string name;
  double peak_bf16_flops = 0;   // dense bf16/fp16 tensor-core FLOP/s
  double peak_fp32_flops = 0;   // fp32 (non-tensor-core) FLOP/s
  double memory_bytes = 0;      // HBM capacity
  double memory_bandwidth = 0;  // HBM bytes/s
  // Dense FP8 (E4M3/E5M2) tensor-core FLOP/s; 0: the device has no FP8 units
  // (A100), and a plan with precision fp8 is refused on it.
  double peak_fp8_flops = 0;
  // Streaming multiprocessors (A100 108, H100 and H200 132: the
  // architecture whitepapers' SXM parts). GEMMs are costed tile by tile
  // over them (cost_model.h); 0: a device without SMs (the cpu), whose
  // GEMMs follow the saturating shape curve instead.
  int sm_count = 0;
};

struct ClusterSpec {
  std::string name;
  int gpus_per_node = 8;          // also the number of rails (one NIC per GPU)
  int gpus_per_pcie_switch = 2;   // GPUs (and their NICs) behind one PCIe switch
  double nvlink_bandwidth = 0;    // bytes/s per GPU per direction into the NVSwitch fabric
  double pcie_bandwidth = 0;      // bytes/s per direction, GPU<->PCIe switch<->NIC
  double nic_bandwidth = 0;       // bytes/s per direction, NIC<->leaf
  int nodes_per_leaf = 1;         // nodes in one group (scalable unit)
  int spines = 0;                 // spine switches; 0 = nodes_per_leaf (full-radix leaves)
  double oversubscription = 1.0;  // leaf downlink bw / leaf uplink bw (>= 1 means thinner uplinks)
  Time nvlink_latency = 0;        // per hop GPU<->NVSwitch
  Time pcie_latency = 0;          // per hop on PCIe
  Time nic_latency = 0;           // NIC<->leaf hop (NIC processing + cable)
  Time switch_latency = 0;        // leaf<->spine hop
  // The NVSwitches reduce and multicast (NVLink SHARP, third-generation
  // NVSwitch of DGX H100/H200): NCCL runs a node's all-reduce as NVLS.
  bool nvlink_sharp = false;
  DeviceSpec device;
};

// Names accepted by cluster_preset(), in a fixed order.
const std::vector<std::string>& cluster_preset_names();
// A built-in preset, or an Error listing the known names.
Result<ClusterSpec> cluster_preset(std::string_view name);

// A cluster described as JSON text. All fields (units are in the names):
//
//   {
//     "base": "dgx-h100",           // optional: start from a preset; then every other field is
//     optional "name": "my-cluster", "gpus_per_node": 8,           // integer >= 1
//     "gpus_per_pcie_switch": 2,    // integer >= 1, divides gpus_per_node
//     "nvlink_GBps": 450,           // NVLink per GPU per direction, GB/s (1e9 B/s)
//     "pcie_GBps": 64,              // PCIe per direction, GB/s
//     "nic_Gbps": 400,              // NIC line rate per GPU, Gb/s (200 HDR, 400 NDR)
//     "nodes_per_leaf": 32,         // integer >= 1
//     "spines": 32,                 // integer >= 0 (0 = nodes_per_leaf)
//     "oversubscription": 1.0,      // >= 1; 2: uplinks carry half the downlink bandwidth
//     "nvlink_latency_ns": 250, "pcie_latency_ns": 250,   // per hop, >= 0
//     "nic_latency_ns": 600, "switch_latency_ns": 300,
//     "nvlink_sharp": true,         // NVSwitch reduces and multicasts (NCCL's NVLS all-reduce)
//     "device": {"name": "H100", "bf16_TFLOPS": 989, "fp32_TFLOPS": 67,
//                "memory_GiB": 80, "memory_GBps": 3350,
//                "fp8_TFLOPS": 1979,  // optional: 0 or absent (without a base) = no FP8
//                "sms": 132}          // optional: SMs; 0 or absent (without a base) = GEMMs by the shape curve
//   }
//
// Unknown fields are errors (they are usually typos). Every error names the
// field and says what a valid value looks like.
Result<ClusterSpec> cluster_spec_from_json(std::string_view text);
// Reads a file and parses it as above; the error names the path.
Result<ClusterSpec> load_cluster_spec(const std::string& path);
// A preset name, else a JSON file path: what a `--cluster NAME|FILE` flag wants.
Result<ClusterSpec> cluster_spec_by_name_or_file(const std::string& name_or_path);

// Checks the invariants build() relies on; errors name the field.
Status validate(const ClusterSpec& spec);

}  // namespace meshtrain::sim
