// An FP8 cast of a GEMM operand (Backend::fp8_cast, models/fp8_linear.h):
// each element is scaled, rounded to the FP8 grid by the hardware conversion
// (__nv_cvt_float_to_fp8, round to nearest even, saturating: the rounding
// core/fp8.h emulates) and scaled back, in the operand's own storage type;
// the amax is the largest |x| of the tensor, folded into the running one, or,
// under current scaling, the tensor's amax the scale is computed from (and
// the amax pass that measures it, Backend::amax).
#include <cfloat>

#include <cuda_fp8.h>

#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {

namespace {

__device__ __forceinline__ float fp8_round(float v, __nv_fp8_interpretation_t format) {
  const __nv_fp8_storage_t bits = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, format)));
}

// Current scaling's scale from the tensor's amax, as core/fp8.h's current_scale.
__device__ __forceinline__ float current_scale(float amax, float largest_fp8) {
  if (!isfinite(amax) || amax == 0.f) return 1.f;
  const float scale = __fdiv_rn(largest_fp8, fabsf(amax));
  if (isinf(scale)) return FLT_MAX;
  return isnan(scale) ? 1.f : scale;
}

// One atomic per block: the block's maximum (block_max), folded into *amax as
// an integer maximum, since non-negative floats order as their bit patterns.
// fmaxf drops NaN elements, so a tensor with a NaN gives its finite
// elements' maximum here where the cpu keeps the running one; either way
// the step's loss is NaN and check_finite stops it.
__device__ __forceinline__ void fold_amax(float largest, float* shared, float* amax) {
  largest = block_max(largest, shared);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(largest));
}

// With `current`, *amax is the tensor's (already reduced) amax that sets the
// scale, read by every block and left alone.
template <class T>
__global__ void fp8_cast_kernel(const T* x, T* y, i64 n, float scale, __nv_fp8_interpretation_t format,
                                float* amax, bool current) {
  __shared__ float shared[32];
  if (current) scale = current_scale(*amax, format == __NV_E5M2 ? 57344.f : 448.f);
  float largest = 0.f;
  const float inverse = 1.f / scale;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float v = to_float(x[i]);
    largest = fmaxf(largest, fabsf(v));
    y[i] = from_float<T>(fp8_round(v * scale, format) * inverse);
  }
  if (!current) fold_amax(largest, shared, amax);
}

template <class T>
__global__ void amax_kernel(const T* x, i64 n, float* amax) {
  __shared__ float shared[32];
  float largest = 0.f;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    largest = fmaxf(largest, fabsf(to_float(x[i])));
  fold_amax(largest, shared, amax);
}

// At most 4096 blocks (about 30 per H100 SM): the grid-stride loop covers the rest, and the amax
// takes one atomic per block.
unsigned blocks_for(i64 n) {
  constexpr i64 kMaxBlocks = 4096;
  return grid_for(n) < kMaxBlocks ? grid_for(n) : static_cast<unsigned>(kMaxBlocks);
}

}  // namespace

cudaError_t fp8_cast(const void* x, void* y, int dtype, i64 n, float scale, bool e5m2, bool current, float* amax,
                     cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  return with_storage(dtype, [&](auto tag) {
    fp8_cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(typed(tag, x), typed(tag, y), n, scale, format, amax, current);
    return cudaGetLastError();
  });
}

cudaError_t amax(const void* x, int dtype, i64 n, float* amax, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    amax_kernel<<<blocks_for(n), kThreads, 0, s>>>(typed(tag, x), n, amax);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
