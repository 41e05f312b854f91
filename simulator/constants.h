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

  // Fraction of dense peak a large bf16 GEMM reaches. cuBLAS reaches ~80-90%
  // of peak on 8192^3 bf16 GEMMs on A100 and H100 (vendor and MLPerf figures).
  double gemm_efficiency_max = 0.85;
  // Shape penalty: eff(m,n,k) = max · m/(m+m_half) · n/(n+n_half) · k/(k+k_half).
  // A dimension equal to its half-size halves its factor; 128-wide tiles and
  // wave quantisation make GEMMs below a few hundred rows inefficient.
  double gemm_m_half = 64;
  double gemm_n_half = 64;
  double gemm_k_half = 64;
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

  // ---- collectives (each algorithm step: time = alpha + hop latencies + bytes / bandwidth) ----

  // α: fixed cost of one algorithm step (kernel-side synchronisation and
  // protocol handshake between neighbours). NCCL's tuning model uses a few µs
  // per step for its Simple protocol.
  Time collective_alpha = 2 * kMicrosecond;
  // Pipelined algorithms (tree, broadcast) split the buffer into chunks of
  // about this size, between 1 and max_pipeline_chunks chunks.
  double pipeline_chunk_bytes = 1 << 20;
  int max_pipeline_chunks = 64;
};

}  // namespace meshtrain::sim
