// LayerNorm and RMSNorm (one warp per row) and the deterministic column
// reductions behind their parameter gradients and bias_backward: per-chunk
// partials (fixed row chunks, see row_chunk) then one fixed-order pass.
// Rows (x, w, b, out, dout, dx) are of storage type T, read into fp32;
// mean, rstd and the parameter gradients are fp32.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

template <class T>
__global__ void layernorm_fwd_kernel(const T* x, const T* w, const T* b, T* out, float* mean,
                                     float* rstd, i64 N, i64 C, float eps) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * C;
  float s = 0.f;
  for (i64 j = lane; j < C; j += 32) s += to_float(xr[j]);
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (i64 j = lane; j < C; j += 32) {
    const float d = to_float(xr[j]) - mu;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* o = out + r * C;
  for (i64 j = lane; j < C; j += 32)
    o[j] = from_float<T>((to_float(xr[j]) - mu) * rs * to_float(w[j]) + to_float(b[j]));
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T>
__global__ void layernorm_dx_kernel(const T* dout, const T* x, const T* w, const float* mean,
                                    const float* rstd, T* dx, i64 N, i64 C) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * C;
  const T* dr = dout + r * C;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0.f, sgx = 0.f;
  for (i64 j = lane; j < C; j += 32) {
    const float g = to_float(dr[j]) * to_float(w[j]);
    sg += g;
    sgx += g * (to_float(xr[j]) - mu) * rs;
  }
  const float mean_g = warp_sum(sg) / static_cast<float>(C);
  const float mean_gx = warp_sum(sgx) / static_cast<float>(C);
  T* o = dx + r * C;
  for (i64 j = lane; j < C; j += 32) {
    const float xhat = (to_float(xr[j]) - mu) * rs;
    o[j] = from_float<T>(rs * (to_float(dr[j]) * to_float(w[j]) - mean_g - xhat * mean_gx));
  }
}

template <class T>
__global__ void rmsnorm_fwd_kernel(const T* x, const T* w, T* out, float* rstd, i64 N, i64 C,
                                   float eps) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * C;
  float ss = 0.f;
  for (i64 j = lane; j < C; j += 32) ss += to_float(xr[j]) * to_float(xr[j]);
  const float rs = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  T* o = out + r * C;
  for (i64 j = lane; j < C; j += 32) o[j] = from_float<T>(to_float(xr[j]) * rs * to_float(w[j]));
  if (lane == 0) rstd[r] = rs;
}

template <class T>
__global__ void rmsnorm_dx_kernel(const T* dout, const T* x, const T* w, const float* rstd, T* dx,
                                  i64 N, i64 C) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const T* xr = x + r * C;
  const T* dr = dout + r * C;
  const float rs = rstd[r];
  float s = 0.f;
  for (i64 j = lane; j < C; j += 32) s += to_float(dr[j]) * to_float(w[j]) * to_float(xr[j]) * rs;
  const float mean_gx = warp_sum(s) / static_cast<float>(C);
  T* o = dx + r * C;
  for (i64 j = lane; j < C; j += 32)
    o[j] = from_float<T>(rs * (to_float(dr[j]) * to_float(w[j]) - to_float(xr[j]) * rs * mean_gx));
}

// What one row contributes to column j of a parameter gradient.
enum class Contribution { bias, layernorm, rmsnorm };

// Block (32 columns × 8 row lanes) for one row chunk: partial[chunk][j] for
// W output columns (layernorm: W = 2C, [dweight | dbias]). Each thread sums
// its rows in order; the 8 row lanes combine in order in shared memory.
template <class T>
__global__ void column_partials(Contribution kind, const T* dy, const T* x, const float* mean,
                                const float* rstd, i64 N, i64 C, i64 W, i64 chunk,
                                double* partials) {
  __shared__ double sh[8][33];
  const i64 j = blockIdx.x * 32 + threadIdx.x;
  const i64 r0 = blockIdx.y * chunk;
  const i64 r1 = r0 + chunk < N ? r0 + chunk : N;
  double acc = 0.0;
  if (j < W) {
    const i64 c = j < C ? j : j - C;
    for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
      const double d = static_cast<double>(to_float(dy[r * C + c]));
      switch (kind) {
        case Contribution::bias: acc += d; break;
        case Contribution::layernorm:
          acc += j < C ? d *
                             (static_cast<double>(to_float(x[r * C + c])) -
                              static_cast<double>(mean[r])) *
                             static_cast<double>(rstd[r])
                       : d;
          break;
        case Contribution::rmsnorm:
          acc += d * static_cast<double>(to_float(x[r * C + c])) * static_cast<double>(rstd[r]);
          break;
      }
    }
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < W) {
    double s = 0.0;
    for (int k = 0; k < 8; ++k) s += sh[k][threadIdx.x];
    partials[blockIdx.y * W + j] = s;
  }
}

// out[j] (j < C) += Σ_chunk partials[chunk][j]; out2[j - C] for j >= C.
__global__ void column_finish(const double* partials, i64 chunks, i64 C, i64 W, float* out,
                              float* out2) {
  const i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  if (j >= W) return;
  float* o = j < C ? out + j : out2 + (j - C);
  double s = static_cast<double>(*o);
  for (i64 c = 0; c < chunks; ++c) s += partials[c * W + j];
  *o = static_cast<float>(s);
}

// dy and x (null for bias) of storage `dtype`.
cudaError_t column_reduce(Contribution kind, const void* dy, const void* x, int dtype,
                          const float* mean, const float* rstd, i64 N, i64 C, float* out,
                          float* out2, double* scratch, cudaStream_t s) {
  const i64 W = kind == Contribution::layernorm ? 2 * C : C;
  if (N <= 0 || W <= 0) return cudaGetLastError();
  const i64 chunk = row_chunk(N), chunks = row_chunks(N);
  const dim3 grid(static_cast<unsigned>((W + 31) / 32), static_cast<unsigned>(chunks));
  const cudaError_t e = with_storage(dtype, [&](auto tag) {
    column_partials<<<grid, dim3(32, 8), 0, s>>>(kind, typed(tag, dy), typed(tag, x), mean, rstd,
                                                 N, C, W, chunk, scratch);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  column_finish<<<grid_for(W), kThreads, 0, s>>>(scratch, chunks, C, W, out, out2);
  return cudaGetLastError();
}

unsigned row_blocks(i64 N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

cudaError_t layernorm_forward(const void* x, const void* w, const void* b, void* out, int dtype,
                              float* mean, float* rstd, i64 N, i64 C, float eps, cudaStream_t s) {
  if (N <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    layernorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(
        typed(tag, x), typed(tag, w), typed(tag, b), typed(tag, out), mean, rstd, N, C, eps);
    return cudaGetLastError();
  });
}

cudaError_t layernorm_backward(const void* dout, const void* x, const void* w, void* dx,
                               int dtype, const float* mean, const float* rstd, float* dw,
                               float* db, i64 N, i64 C, double* scratch, cudaStream_t s) {
  if (N > 0) {
    const cudaError_t e = with_storage(dtype, [&](auto tag) {
      layernorm_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(
          typed(tag, dout), typed(tag, x), typed(tag, w), mean, rstd, typed(tag, dx), N, C);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  return column_reduce(Contribution::layernorm, dout, x, dtype, mean, rstd, N, C, dw, db, scratch,
                       s);
}

cudaError_t rmsnorm_forward(const void* x, const void* w, void* out, int dtype, float* rstd, i64 N,
                            i64 C, float eps, cudaStream_t s) {
  if (N <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    rmsnorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(typed(tag, x), typed(tag, w),
                                                          typed(tag, out), rstd, N, C, eps);
    return cudaGetLastError();
  });
}

cudaError_t rmsnorm_backward(const void* dout, const void* x, const void* w, void* dx, int dtype,
                             const float* rstd, float* dw, i64 N, i64 C, double* scratch,
                             cudaStream_t s) {
  if (N > 0) {
    const cudaError_t e = with_storage(dtype, [&](auto tag) {
      rmsnorm_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(typed(tag, dout), typed(tag, x),
                                                           typed(tag, w), rstd, typed(tag, dx), N, C);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  return column_reduce(Contribution::rmsnorm, dout, x, dtype, nullptr, rstd, N, C, dw, nullptr,
                       scratch, s);
}

cudaError_t bias_backward(const void* dy, int dtype, float* db, i64 m, i64 n, double* scratch,
                          cudaStream_t s) {
  return column_reduce(Contribution::bias, dy, nullptr, dtype, nullptr, nullptr, m, n, db, nullptr,
                       scratch, s);
}

}  // namespace meshtrain::cuda::kernels
