// 1-bit sign compression with error feedback (kernels.h): one block per
// chunk; the chunk's Σ|y| in double through the fixed-order block reduction;
// each sign word is built by one warp's ballot, so no atomics. Decompression
// is elementwise.
#include <cstdint>
#include <cstring>

#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

__global__ void sign_compress_kernel(const float* x, float* error, std::int32_t* packets, i64 C, i64 k, i64 W) {
  __shared__ double shared[32];
  for (i64 c = blockIdx.x; c < C; c += gridDim.x) {
    const float* xc = x + c * k;
    float* ec = error != nullptr ? error + c * k : nullptr;
    double part = 0;
    for (i64 i = threadIdx.x; i < k; i += blockDim.x) part += fabs(static_cast<double>(ec ? xc[i] + ec[i] : xc[i]));
    const double sum = block_sum(part, shared);
    const float scale = k > 0 ? static_cast<float>(sum / static_cast<double>(k)) : 0.f;
    std::int32_t* row = packets + c * (1 + W);
    if (threadIdx.x == 0) row[0] = __float_as_int(scale);
    // Warp w of the block builds sign words w, w + warps, ...; lane l holds element 32·word + l.
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (i64 w = threadIdx.x >> 5; w < W; w += warps) {
      const i64 i = w * 32 + lane;
      bool positive = false;
      if (i < k) {
        const float v = ec ? xc[i] + ec[i] : xc[i];
        positive = v >= 0.f;
        if (ec) ec[i] = v - (positive ? scale : -scale);
      }
      const unsigned bits = __ballot_sync(0xffffffffu, positive);
      if (lane == 0) row[1 + w] = static_cast<std::int32_t>(bits);
    }
    __syncthreads();  // shared is reused by the next chunk's sum
  }
}

__global__ void sign_decompress_kernel(const std::int32_t* packets, float* out, i64 C, i64 k, i64 W) {
  const i64 n = C * k;
  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    const i64 c = e / k, i = e % k;
    const std::int32_t* row = packets + c * (1 + W);
    const float scale = __int_as_float(row[0]);
    const unsigned bits = static_cast<unsigned>(row[1 + i / 32]);
    out[e] = (bits >> (i % 32)) & 1u ? scale : -scale;
  }
}

}  // namespace

cudaError_t sign_compress(const float* x, float* error, std::int32_t* packets, i64 C, i64 k, cudaStream_t s) {
  if (C == 0) return cudaSuccess;
  const i64 W = (k + 31) / 32;
  const unsigned blocks = static_cast<unsigned>(C < 65535 ? C : 65535);
  sign_compress_kernel<<<blocks, kThreads, 0, s>>>(x, error, packets, C, k, W);
  return cudaGetLastError();
}

cudaError_t sign_decompress(const std::int32_t* packets, float* out, i64 C, i64 k, cudaStream_t s) {
  if (C * k == 0) return cudaSuccess;
  const i64 W = (k + 31) / 32;
  sign_decompress_kernel<<<grid_for(C * k), kThreads, 0, s>>>(packets, out, C, k, W);
  return cudaGetLastError();
}

}  // namespace meshtrain::cuda::kernels
