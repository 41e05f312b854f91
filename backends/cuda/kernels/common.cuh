// Device helpers shared by the kernels: dtype loads and stores, the storage
// type dispatch, warp and block reductions in a fixed order, grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/kernels/kernels.h"

namespace meshtrain::cuda::kernels {

inline constexpr int kThreads = 256;

inline unsigned grid_for(i64 n, int threads = kThreads) {
  i64 g = (n + threads - 1) / threads;
  if (g > 65535 * 16) g = 65535 * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

__device__ __forceinline__ float load_as_float(const void* p, int dtype, i64 i) {
  switch (dtype) {
    case 0: return static_cast<const float*>(p)[i];
    case 1: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case 2: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
  }
}

__device__ __forceinline__ void store_float(void* p, int dtype, i64 i, float v) {
  switch (dtype) {
    case 0: static_cast<float*>(p)[i] = v; return;
    case 1: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); return;
    case 2: static_cast<__half*>(p)[i] = __float2half_rn(v); return;
    default: static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(llroundf(v)); return;
  }
}

// Storage type T of a kernel's tensors <-> the fp32 it computes in. For
// T = float both are the identity, so the fp32 kernels keep their bits.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Calls f(Storage<T>{}) with T the storage type of dtype code `dtype` (0 f32,
// 1 bf16, 2 f16): the one place a launcher turns a runtime dtype into a
// kernel template argument. Other codes are a caller's bug (op_checks.h
// rejects them first) and give cudaErrorInvalidValue.
template <class T>
struct Storage {
  using type = T;
};
// Inside f: typed(tag, p) is the void pointer p as a (const) T pointer.
template <class T>
const T* typed(Storage<T>, const void* p) {
  return static_cast<const T*>(p);
}
template <class T>
T* typed(Storage<T>, void* p) {
  return static_cast<T*>(p);
}
template <class F>
cudaError_t with_storage(int dtype, F&& f) {
  switch (dtype) {
    case 0: return f(Storage<float>{});
    case 1: return f(Storage<__nv_bfloat16>{});
    case 2: return f(Storage<__half>{});
    default: return cudaErrorInvalidValue;
  }
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): warp sums,
// then warp 0 sums the warp partials; the same order every run. Every
// thread gets the result. `shared` holds 32 values.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  T r = lane < warps ? shared[lane] : T(0);
  if (warp == 0) r = warp_sum(r);
  if (threadIdx.x == 0) shared[0] = r;
  __syncthreads();
  return shared[0];
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float r = lane < warps ? shared[lane] : -INFINITY;
  if (warp == 0) r = warp_max(r);
  if (threadIdx.x == 0) shared[0] = r;
  __syncthreads();
  return shared[0];
}

}  // namespace meshtrain::cuda::kernels
