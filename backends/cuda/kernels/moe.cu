// The mixture-of-experts kernels (kernels.h, moe.cu): the router's softmax,
// top-k and renormalisation and their backward, one thread per token in
// double as the cpu backend computes them; the combine and its backward, one
// block per token, slots summed in slot order (dot products through the
// fixed-order block reduction). No atomics: every output is written once.
#include <climits>
#include <cstdint>

#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

__global__ void route_kernel(const float* logits, float* probs, float* lse, float* weights, std::int32_t* experts,
                             i64 N, i64 E, i64 K, bool renormalize) {
  for (i64 n = blockIdx.x * (i64)blockDim.x + threadIdx.x; n < N; n += (i64)gridDim.x * blockDim.x) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    double max = l[0];
    for (i64 e = 1; e < E; ++e) max = fmax(max, static_cast<double>(l[e]));
    double sum = 0;
    for (i64 e = 0; e < E; ++e) sum += exp(static_cast<double>(l[e]) - max);
    const double log_sum = max + log(sum);
    lse[n] = static_cast<float>(log_sum);
    for (i64 e = 0; e < E; ++e) p[e] = static_cast<float>(exp(static_cast<double>(l[e]) - log_sum));
    std::int32_t* chosen = experts + n * K;
    double total = 0;
    for (i64 k = 0; k < K; ++k) {
      i64 best = -1;
      for (i64 e = 0; e < E; ++e) {
        bool taken = false;
        for (i64 j = 0; j < k; ++j) taken = taken || chosen[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      chosen[k] = static_cast<std::int32_t>(best);
      total += p[best];
    }
    for (i64 k = 0; k < K; ++k)
      weights[n * K + k] = renormalize ? static_cast<float>(p[chosen[k]] / total) : p[chosen[k]];
  }
}

__global__ void route_backward_kernel(const float* dweights, const float* probs, const float* lse,
                                      const std::int32_t* experts, const float* prob_grad, float z_scale,
                                      bool renormalize, float* dlogits, i64 N, i64 E, i64 K) {
  for (i64 n = blockIdx.x * (i64)blockDim.x + threadIdx.x; n < N; n += (i64)gridDim.x * blockDim.x) {
    const float* p = probs + n * E;
    const std::int32_t* chosen = experts + n * K;
    const float* dw = dweights + n * K;
    // The chosen experts' extra probability gradient (see the cpu kernel), per slot.
    double extra[kMaxTopK];
    double s = 0, dot = 0;
    for (i64 k = 0; k < K; ++k) s += p[chosen[k]];
    for (i64 k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * (p[chosen[k]] / s);
    for (i64 k = 0; k < K; ++k) extra[k] = renormalize ? (dw[k] - dot) / s : static_cast<double>(dw[k]);
    double pg = 0;
    for (i64 e = 0; e < E; ++e) pg += static_cast<double>(p[e]) * prob_grad[e];
    for (i64 k = 0; k < K; ++k) pg += static_cast<double>(p[chosen[k]]) * extra[k];
    const double z = 2.0 * static_cast<double>(z_scale) * lse[n];
    for (i64 e = 0; e < E; ++e) {
      double g = prob_grad[e];
      for (i64 k = 0; k < K; ++k)
        if (chosen[k] == e) g += extra[k];
      dlogits[n * E + e] = static_cast<float>(p[e] * (g - pg) + z * p[e]);
    }
  }
}

template <class T>
__global__ void combine_kernel(const T* rows, const std::int32_t* index, const float* weights, T* out, i64 N,
                               i64 K, i64 C) {
  for (i64 n = blockIdx.x; n < N; n += gridDim.x)
    for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = 0.f;
      for (i64 k = 0; k < K; ++k) {
        const std::int32_t i = index[n * K + k];
        if (i >= 0) acc += weights[n * K + k] * to_float(rows[static_cast<i64>(i) * C + c]);
      }
      out[n * C + c] = from_float<T>(acc);
    }
}

template <class T>
__global__ void zero_rows_kernel(T* x, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    x[i] = from_float<T>(0.f);
}

template <class T>
__global__ void combine_backward_kernel(const T* dout, const T* rows, const std::int32_t* index,
                                        const float* weights, T* drows, float* dweights, i64 N, i64 K, i64 C) {
  __shared__ double partial[32];
  for (i64 n = blockIdx.x; n < N; n += gridDim.x)
    for (i64 k = 0; k < K; ++k) {
      const std::int32_t i = index[n * K + k];  // uniform over the block
      if (i < 0) {
        if (threadIdx.x == 0) dweights[n * K + k] = 0.f;
        continue;
      }
      const float w = weights[n * K + k];
      double dot = 0;
      for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = to_float(dout[n * C + c]);
        drows[static_cast<i64>(i) * C + c] = from_float<T>(w * g);
        dot += static_cast<double>(g) * to_float(rows[static_cast<i64>(i) * C + c]);
      }
      dot = block_sum(dot, partial);
      if (threadIdx.x == 0) dweights[n * K + k] = static_cast<float>(dot);
    }
}

unsigned blocks_for(i64 n) { return static_cast<unsigned>(n < 65535 * 16 ? (n < 1 ? 1 : n) : 65535 * 16); }

}  // namespace

cudaError_t moe_route(const float* logits, float* probs, float* lse, float* weights, std::int32_t* experts, i64 N,
                      i64 E, i64 K, bool renormalize, cudaStream_t s) {
  if (K < 1 || K > kMaxTopK || K > E) return cudaErrorInvalidValue;
  if (N <= 0) return cudaGetLastError();
  route_kernel<<<grid_for(N), kThreads, 0, s>>>(logits, probs, lse, weights, experts, N, E, K, renormalize);
  return cudaGetLastError();
}

cudaError_t moe_route_backward(const float* dweights, const float* probs, const float* lse,
                               const std::int32_t* experts, const float* prob_grad, float z_scale, bool renormalize,
                               float* dlogits, i64 N, i64 E, i64 K, cudaStream_t s) {
  if (K < 1 || K > kMaxTopK || K > E) return cudaErrorInvalidValue;
  if (N <= 0) return cudaGetLastError();
  route_backward_kernel<<<grid_for(N), kThreads, 0, s>>>(dweights, probs, lse, experts, prob_grad, z_scale,
                                                         renormalize, dlogits, N, E, K);
  return cudaGetLastError();
}

cudaError_t moe_combine(const void* rows, const std::int32_t* index, const float* weights, void* out, int dtype,
                        i64 N, i64 K, i64 C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    combine_kernel<<<blocks_for(N), kThreads, 0, s>>>(typed(tag, rows), index, weights, typed(tag, out), N, K, C);
    return cudaGetLastError();
  });
}

cudaError_t moe_combine_backward(const void* dout, const void* rows, const std::int32_t* index,
                                 const float* weights, void* drows, float* dweights, int dtype, i64 N, i64 K, i64 C,
                                 i64 M, cudaStream_t s) {
  return with_storage(dtype, [&](auto tag) {
    if (M > 0 && C > 0) zero_rows_kernel<<<grid_for(M * C), kThreads, 0, s>>>(typed(tag, drows), M * C);
    if (N > 0 && C > 0)
      combine_backward_kernel<<<blocks_for(N), kThreads, 0, s>>>(typed(tag, dout), typed(tag, rows), index, weights,
                                                                 typed(tag, drows), dweights, N, K, C);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
