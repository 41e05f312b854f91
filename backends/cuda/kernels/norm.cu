// LayerNorm and RMSNorm (one warp per row) and the deterministic column
// reductions behind their parameter gradients and bias_backward: per-chunk
// partials (fixed row chunks, see row_chunk) then one fixed-order pass.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

__global__ void layernorm_fwd_kernel(const float* x, const float* w, const float* b, float* out,
                                     float* mean, float* rstd, i64 N, i64 C, float eps) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float* xr = x + r * C;
  float s = 0.f;
  for (i64 j = lane; j < C; j += 32) s += xr[j];
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (i64 j = lane; j < C; j += 32) {
    const float d = xr[j] - mu;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  float* o = out + r * C;
  for (i64 j = lane; j < C; j += 32) o[j] = (xr[j] - mu) * rs * w[j] + b[j];
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void layernorm_dx_kernel(const float* dout, const float* x, const float* w,
                                    const float* mean, const float* rstd, float* dx, i64 N, i64 C) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float* xr = x + r * C;
  const float* dr = dout + r * C;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0.f, sgx = 0.f;
  for (i64 j = lane; j < C; j += 32) {
    const float g = dr[j] * w[j];
    sg += g;
    sgx += g * (xr[j] - mu) * rs;
  }
  const float mean_g = warp_sum(sg) / static_cast<float>(C);
  const float mean_gx = warp_sum(sgx) / static_cast<float>(C);
  float* o = dx + r * C;
  for (i64 j = lane; j < C; j += 32) {
    const float xhat = (xr[j] - mu) * rs;
    o[j] = rs * (dr[j] * w[j] - mean_g - xhat * mean_gx);
  }
}

__global__ void rmsnorm_fwd_kernel(const float* x, const float* w, float* out, float* rstd, i64 N,
                                   i64 C, float eps) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float* xr = x + r * C;
  float ss = 0.f;
  for (i64 j = lane; j < C; j += 32) ss += xr[j] * xr[j];
  const float rs = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  float* o = out + r * C;
  for (i64 j = lane; j < C; j += 32) o[j] = xr[j] * rs * w[j];
  if (lane == 0) rstd[r] = rs;
}

__global__ void rmsnorm_dx_kernel(const float* dout, const float* x, const float* w,
                                  const float* rstd, float* dx, i64 N, i64 C) {
  const i64 r = blockIdx.x * (i64)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float* xr = x + r * C;
  const float* dr = dout + r * C;
  const float rs = rstd[r];
  float s = 0.f;
  for (i64 j = lane; j < C; j += 32) s += dr[j] * w[j] * xr[j] * rs;
  const float mean_gx = warp_sum(s) / static_cast<float>(C);
  float* o = dx + r * C;
  for (i64 j = lane; j < C; j += 32) o[j] = rs * (dr[j] * w[j] - xr[j] * rs * mean_gx);
}

// What one row contributes to column j of a parameter gradient.
enum class Contribution { bias, layernorm, rmsnorm };

// Block (32 columns × 8 row lanes) for one row chunk: partial[chunk][j] for
// W output columns (layernorm: W = 2C, [dweight | dbias]). Each thread sums
// its rows in order; the 8 row lanes combine in order in shared memory.
__global__ void column_partials(Contribution kind, const float* dy, const float* x,
                                const float* mean, const float* rstd, i64 N, i64 C, i64 W,
                                i64 chunk, double* partials) {
  __shared__ double sh[8][33];
  const i64 j = blockIdx.x * 32 + threadIdx.x;
  const i64 r0 = blockIdx.y * chunk;
  const i64 r1 = r0 + chunk < N ? r0 + chunk : N;
  double acc = 0.0;
  if (j < W) {
    const i64 c = j < C ? j : j - C;
    for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
      const double d = static_cast<double>(dy[r * C + c]);
      switch (kind) {
        case Contribution::bias: acc += d; break;
        case Contribution::layernorm:
          acc += j < C ? d * (static_cast<double>(x[r * C + c]) - static_cast<double>(mean[r])) *
                             static_cast<double>(rstd[r])
                       : d;
          break;
        case Contribution::rmsnorm:
          acc += d * static_cast<double>(x[r * C + c]) * static_cast<double>(rstd[r]);
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

cudaError_t column_reduce(Contribution kind, const float* dy, const float* x, const float* mean,
                          const float* rstd, i64 N, i64 C, float* out, float* out2,
                          double* scratch, cudaStream_t s) {
  const i64 W = kind == Contribution::layernorm ? 2 * C : C;
  if (N <= 0 || W <= 0) return cudaGetLastError();
  const i64 chunk = row_chunk(N), chunks = row_chunks(N);
  const dim3 grid(static_cast<unsigned>((W + 31) / 32), static_cast<unsigned>(chunks));
  column_partials<<<grid, dim3(32, 8), 0, s>>>(kind, dy, x, mean, rstd, N, C, W, chunk, scratch);
  column_finish<<<grid_for(W), kThreads, 0, s>>>(scratch, chunks, C, W, out, out2);
  return cudaGetLastError();
}

unsigned row_blocks(i64 N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

cudaError_t layernorm_forward(const float* x, const float* w, const float* b, float* out,
                              float* mean, float* rstd, i64 N, i64 C, float eps, cudaStream_t s) {
  if (N > 0) layernorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(x, w, b, out, mean, rstd, N, C, eps);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const float* dout, const float* x, const float* w,
                               const float* mean, const float* rstd, float* dx, float* dw,
                               float* db, i64 N, i64 C, double* scratch, cudaStream_t s) {
  if (N > 0) layernorm_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(dout, x, w, mean, rstd, dx, N, C);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return column_reduce(Contribution::layernorm, dout, x, mean, rstd, N, C, dw, db, scratch, s);
}

cudaError_t rmsnorm_forward(const float* x, const float* w, float* out, float* rstd, i64 N, i64 C,
                            float eps, cudaStream_t s) {
  if (N > 0) rmsnorm_fwd_kernel<<<row_blocks(N), kThreads, 0, s>>>(x, w, out, rstd, N, C, eps);
  return cudaGetLastError();
}

cudaError_t rmsnorm_backward(const float* dout, const float* x, const float* w, const float* rstd,
                             float* dx, float* dw, i64 N, i64 C, double* scratch, cudaStream_t s) {
  if (N > 0) rmsnorm_dx_kernel<<<row_blocks(N), kThreads, 0, s>>>(dout, x, w, rstd, dx, N, C);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return column_reduce(Contribution::rmsnorm, dout, x, nullptr, rstd, N, C, dw, nullptr, scratch, s);
}

cudaError_t bias_backward(const float* dy, float* db, i64 m, i64 n, double* scratch,
                          cudaStream_t s) {
  return column_reduce(Contribution::bias, dy, nullptr, nullptr, nullptr, m, n, db, nullptr,
                       scratch, s);
}

}  // namespace meshtrain::cuda::kernels
