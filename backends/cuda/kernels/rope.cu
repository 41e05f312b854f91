// Rotary position embedding: the angle table is computed in double, once per
// (t, i), as backends/cpu/kernels/rope.h does, then applied in place in fp32
// to x of storage type S.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

__global__ void rope_table(i64 T, i64 t0, i64 P, i64 D, double theta, bool inverse, float* cs, float* sn) {
  for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < T * P; idx += (i64)gridDim.x * blockDim.x) {
    const i64 t = idx / P, i = idx % P;
    const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const double a = static_cast<double>(t0 + t) * freq;
    cs[idx] = static_cast<float>(cos(a));
    sn[idx] = static_cast<float>(inverse ? -sin(a) : sin(a));
  }
}

template <class S>
__global__ void rope_apply(S* x, i64 rows, i64 T, i64 heads_total, i64 rotate_heads, i64 P,
                           const float* cs, const float* sn) {
  const i64 per_row = rotate_heads * P;
  for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < rows * per_row; idx += (i64)gridDim.x * blockDim.x) {
    const i64 row = idx / per_row, h = (idx % per_row) / P, i = idx % P;
    const i64 t = row % T;
    S* v = x + (row * heads_total + h) * 2 * P;
    const float c = cs[t * P + i], s = sn[t * P + i];
    const float x0 = to_float(v[2 * i]), x1 = to_float(v[2 * i + 1]);
    v[2 * i] = from_float<S>(x0 * c - x1 * s);
    v[2 * i + 1] = from_float<S>(x0 * s + x1 * c);
  }
}

}  // namespace

cudaError_t rope(void* x, int dtype, i64 B, i64 T, i64 heads_total, i64 rotate_heads, i64 D,
                 double theta, bool inverse, i64 first_position, float* scratch, cudaStream_t s) {
  const i64 P = D / 2;
  if (B * T * rotate_heads * P == 0) return cudaGetLastError();
  float* cs = scratch;
  float* sn = scratch + T * P;
  rope_table<<<grid_for(T * P), kThreads, 0, s>>>(T, first_position, P, D, theta, inverse, cs, sn);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return with_storage(dtype, [&](auto tag) {
    rope_apply<<<grid_for(B * T * rotate_heads * P), kThreads, 0, s>>>(
        typed(tag, x), B * T, T, heads_total, rotate_heads, P, cs, sn);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
