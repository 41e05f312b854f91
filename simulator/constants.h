// Every tunable constant of the simulator's cost models, in one table.
//
// Hardware facts (peak FLOP/s, link bandwidths) live with the cluster
// (cluster_spec.h); this table holds the model's own numbers: how far real
// kernels fall short of peak, and the fixed costs of launching kernels and
// collective steps. A calibration file (calibration.h) replaces the
// estimates with measurements where it has them.
//
// Changing a default changes every prediction: say why in the commit and
// rerun the validation tables.
#pragma once

#include "simulator/event_queue.h"

namespace meshtrain::sim {

struct CostConstants {
  // ---- compute (roofline: time = max(flops / (peak·eff), bytes / (bw·eff_mem)) + launch) ----

  // Fraction of dense peak a large bf16/fp16 GEMM sustains in training.
  // cuBLAS benchmarks of large (8192^3) half-precision GEMMs on A100-SXM4
  // reach ~250 of 312 TFLOP/s (~0.80) at boost clock, for seconds; under a
  // whole training job's sustained 400 W load the SXM4 runs below its
  // 1410 MHz boost, and published sustained measurements at transformer
  // sizes sit at ~70-80% of peak (H100-SXM5 likewise ~700-780 of 989).
  // 0.75 is the middle of that sustained range; the shape factors below
  // lower it further for thin GEMMs (h = 2304 layers sit at ~0.73). Was
  // 0.85 (a short-burst figure) until the Narayanan et al. 2021 validation
  // over-predicted every row once the engine issued real 16-bit tensors;
  // RESULTS.md gives the table at 0.78 and at 0.75.
  double gemm_efficiency_max = 0.75;
  // How much of that a GEMM of a given shape keeps, on a device with SMs
  // (DeviceSpec::sm_count): the tile model of CostModel::gemm_efficiency.
  // Each SM computes output tiles; a tile's time is its main loop (2·tm·tn·k
  // FLOPs at the SM's share of peak times this efficiency) plus its
  // epilogue (the tile's output stored at the SM's share of HBM bandwidth);
  // tiles run in waves of sm_count. 0.95 fits the per-shape H100 (sm_90)
  // GEMM throughputs that XLA publishes for its matmul cost model
  // (openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h: 53
  // bf16 shapes of 256-4096 per dimension; RMS log error 0.12 with the
  // epilogue from HBM bandwidth and a fitted 5 µs launch as the only other
  // free parameter; experiments/gemm/fit_tiles.py refits it from the copied
  // figures). Those are short runs at boost clock; the large-GEMM level
  // under a training job's load stays gemm_efficiency_max, this sets only
  // the shape dependence (the epilogue's share of a tile, which grows as the
  // main loop speeds up). As the simulator runs it (kernel_overhead's 3 µs
  // launch, times scaled to the sustained level) the error relative to the
  // 4096³ point is 0.30 over all 53 shapes and 0.25 over the 32 of at least
  // 1024³ FLOP volume, against 0.54 and 0.36 for the saturating curve below:
  // the launch share of the smallest GEMMs is what it misses.
  double gemm_mainloop_efficiency = 0.95;
  // Without SMs (the cpu device): eff(m,n,k) = max · m/(m+m_half) ·
  // n/(n+n_half) · k/(k+k_half); a dimension equal to its half-size halves
  // its factor.
  double gemm_m_half = 64;
  double gemm_n_half = 64;
  double gemm_k_half = 64;
  // Without SMs, a grouped GEMM (MoE experts; CostModel::grouped_gemm) pads
  // each group's rows to this many (CUTLASS's and Transformer Engine's
  // grouped kernels use 128-row tiles): a group of 130 tokens costs two
  // tiles. With SMs the tile model counts each group's tiles itself.
  std::int64_t grouped_gemm_tile_rows = 128;
  // FlashAttention-2 reaches 50-70% of peak in the forward pass on A100/H100
  // (Dao 2023); short sequences and small heads are worse.
  double attention_efficiency_max = 0.6;
  double attention_seq_half = 256;      // eff factor seq/(seq+half)
  double attention_head_dim_half = 32;  // eff factor d/(d+half)
  // Fraction of HBM bandwidth a streaming (element-wise, norm, copy) kernel
  // reaches: ~80-90% in STREAM-like measurements.
  double memory_efficiency = 0.8;
  // Fixed cost of every kernel: launch, ramp-up and tail, ~2-5 µs measured
  // for small kernels issued back to back.
  Time kernel_overhead = 3 * kMicrosecond;
  // While a communication kernel runs on a GPU it holds SMs (NCCL uses 1-32
  // channels, one SM each) and HBM bandwidth; concurrent compute on the same
  // GPU runs this much slower (0.1 = 10% longer). Measured overlap penalties
  // for NCCL + GEMM are typically 5-20%.
  double comm_compute_slowdown = 0.10;

  // ---- links: the share of a link's line rate that NCCL's collectives move ----
  //
  // The cluster presets hold line rates (hardware facts). NCCL's kernels move
  // data with SM-driven copies in chunks with flags and flow control (the
  // Simple protocol), and an InfiniBand NIC loses headers and RDMA overhead,
  // so measured bus bandwidth (nccl-tests' busbw, which the ring formula turns
  // back into a per-link rate) stays below the line rate. The sim backend
  // builds its cluster with these shares applied to the NVLink and NIC
  // bandwidths unless a calibration measured them (backends/sim/sim_cluster.cc); the simulator core
  // (simulator/topology.h) keeps the line rates.
  //
  // NVLink: nccl-tests all_reduce_perf on one DGX A100 (8 GPUs, NVSwitch),
  // large messages, reports ~230 GB/s busbw of 300 GB/s per GPU per direction
  // (NVIDIA's DGX A100 / NCCL 2.x published figures; ~0.77). DGX H100 rings
  // reach ~360 GB/s of 450 (0.80; NVLS all-reduce: nvls_efficiency below).
  double nvlink_efficiency = 0.77;
  // NVLink SHARP all-reduce (Algorithm::kNvls): the switch reduces and
  // multicasts, so each GPU moves its buffer once each way, at this share of
  // the NVLink's NCCL rate (nvlink_efficiency). NCCL's maintainers quote an
  // 8-GPU H100 all-reduce at ~275 GB/s algbw (~480 GB/s busbw) with NVLS
  // against ~370 GB/s busbw for rings (NVIDIA/nccl-tests#212, NVIDIA/nccl#1442:
  // "a 30% improvement"), and a measured sweep gives 258-273 GB/s algbw for
  // 5-8 GPUs (NVIDIA/nccl#1455): 274 / (450 · 0.77) = 0.79. Below 5 GPUs the
  // same sweep finds NVLS no faster than a ring; the model still prefers it
  // for large buffers there (a ring's 2·3/4 against 1/0.79: 16% at 4 GPUs).
  double nvls_efficiency = 0.79;
  // Its fixed cost, in place of collective_alpha: NCCL's tuner charges NVLS
  // 23 µs over NVLink (src/graph/tuning.cc, hwLat[NVLINK][NVLS][Simple])
  // against 3.4 µs per ring step, so a node's small all-reduces stay rings
  // or trees.
  Time nvls_alpha = 23 * kMicrosecond;
  // Network: nccl-tests across DGX A100 nodes reach ~185 Gb/s busbw per
  // 200 Gb/s HDR rail (~0.92); NDR rails on DGX H100 likewise ~370 of 400.
  double network_efficiency = 0.92;

  // ---- host offload (ZeRO-Offload: optimizer state in host memory) ----

  // Share of the PCIe line rate that copies between page-locked host memory
  // and a GPU reach: cudaMemcpyAsync moves ~25 of PCIe 4.0 x16's 32 GB/s
  // and ~12.5 of PCIe 3.0's 16 (bandwidthTest figures; ~0.8). Used unless a
  // calibration measured the "pcie" link.
  double pcie_copy_efficiency = 0.8;
  // Bytes per second that a node's host CPUs stream through a vectorized,
  // multi-threaded AdamW (bytes as the adamw op counts them: 28 per fp32
  // parameter), when no calibration measured the "host_adamw" op. AdamW is
  // memory-bound: a two-socket server (DGX A100: 2x EPYC 7742, ~300 GB/s
  // STREAM) is taken at a third of that, 100 GB/s, about 3.6 G parameters
  // per second per node; the node's GPUs that offload share it.
  double host_adamw_bandwidth = 100e9;

  // ---- collectives (each algorithm step: time = alpha + hop latencies + bytes / bandwidth) ----

  // α: fixed cost of one algorithm step (kernel-side synchronisation and
  // protocol handshake between neighbours). NCCL's tuning model uses a few µs
  // per step for its Simple protocol.
  Time collective_alpha = 2 * kMicrosecond;
  // α of a step whose flows leave the node (a network hop of an inter-node
  // ring, tree or rail ring): NCCL's tuner (src/graph/tuning.cc,
  // hwLatencies[NET]) charges 14 µs per network step of its Simple protocol,
  // the one it picks for the megabyte-sized buckets that matter here (2.7
  // and 4 µs for LL and LL128, used below ~64 KiB), against 3.4 µs per
  // NVLink step: a network step waits for the proxy thread, the NIC's RDMA
  // write and the flag poll on the far side. A ring over n nodes pays it
  // n-1 times (reduce-scatter, all-gather) or 2(n-1) (all-reduce).
  Time collective_net_alpha = 14 * kMicrosecond;
  // Pipelined algorithms (tree, broadcast) split the buffer into chunks of
  // about this size, between 1 and max_pipeline_chunks chunks.
  double pipeline_chunk_bytes = 1 << 20;
  int max_pipeline_chunks = 64;
};

}  // namespace meshtrain::sim
