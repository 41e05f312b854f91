// Where a token's q, k and v rows, the output and the log-sum-exp sit, and
// the launch of a kernel with large shared memory, shared
// by the CUDA-core (attention.cu) and tensor-core (attention_tc.cu) kernels so
// that both read the qkv layout of backend.h's attention ops the same way.
// Legend: B batch, T sequence, H query heads, G kv heads, D head dim,
// W = (H + 2G)·D the width of one token's qkv row; the query window is rows
// [Q0, Q0 + QN) of T (all T: Q0 0, QN T), and out, dout and lse hold only its
// rows, indexed here by the query's position t in the sequence.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"

namespace meshtrain::cuda::kernels {

struct AttentionLayout {
  i64 T, H, G, D, W;
  i64 Q0, QN;  // the query window
  __device__ i64 q(i64 b, i64 t, i64 h) const { return (b * T + t) * W + h * D; }
  __device__ i64 k(i64 b, i64 t, i64 g) const { return (b * T + t) * W + (H + g) * D; }
  __device__ i64 v(i64 b, i64 t, i64 g) const { return (b * T + t) * W + (H + G + g) * D; }
  __device__ i64 o(i64 b, i64 t, i64 h) const { return ((b * QN + t - Q0) * H + h) * D; }
  __device__ i64 l(i64 b, i64 h, i64 t) const { return (b * H + h) * QN + t - Q0; }
  __device__ i64 query_end() const { return Q0 + QN; }
};

// Launches `kernel` with `smem` bytes of dynamic shared memory, opting in
// first: beyond 48 KiB a kernel must (per device).
template <class K, class... Args>
cudaError_t launch_with_smem(K kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t s,
                             Args... args) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  kernel<<<grid, threads, smem, s>>>(args...);
  return cudaGetLastError();
}

inline AttentionLayout attention_layout(const AttentionShape& d) {
  return AttentionLayout{d.T, d.H, d.G, d.D, (d.H + 2 * d.G) * d.D, d.q0, d.rows()};
}

}  // namespace meshtrain::cuda::kernels
