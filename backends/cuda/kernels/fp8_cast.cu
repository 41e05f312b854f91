// An FP8 cast of a GEMM operand (Backend::fp8_cast, models/fp8_linear.h):
// each element is scaled, rounded to the FP8 grid by the hardware conversion
// (__nv_cvt_float_to_fp8, round to nearest even, saturating: the rounding
// core/fp8.h emulates) and scaled back, in the operand's own storage type;
// the amax is the largest |x| of the tensor, folded into the running one.
#include <cuda_fp8.h>

#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {

namespace {

__device__ __forceinline__ float fp8_round(float v, __nv_fp8_interpretation_t format) {
  const __nv_fp8_storage_t bits = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, format)));
}

// Non-negative floats order as their bit patterns: an integer atomicMax folds
// the block maxima. fmaxf drops NaN, as the cpu backend's running maximum does.
template <class T>
__global__ void fp8_cast_kernel(const T* x, T* y, i64 n, float scale, __nv_fp8_interpretation_t format,
                                float* amax) {
  float largest = 0.f;
  const float inverse = 1.f / scale;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float v = to_float(x[i]);
    largest = fmaxf(largest, fabsf(v));
    y[i] = from_float<T>(fp8_round(v * scale, format) * inverse);
  }
  for (int offset = 16; offset > 0; offset /= 2) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(largest));
}

}  // namespace

cudaError_t fp8_cast(const void* x, void* y, int dtype, i64 n, float scale, bool e5m2, float* amax, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  return with_storage(dtype, [&](auto tag) {
    fp8_cast_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, x), typed(tag, y), n, scale, format, amax);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
