// Causal grouped-query flash attention, forward and backward, fp32, bf16 or
// fp16 storage with fp32 math. Nothing of size T×T is stored: forward keeps an
// online softmax per query row and saves its log-sum-exp; backward recomputes
// the probabilities from it (as backends/cpu/kernels/attention.h does).
//
// These are the CUDA-core kernels. 16-bit storage with D = 64 or 128 takes the
// tensor-core kernels of attention_tc.cu instead; these stay for fp32 (the
// exact mode the cpu backend is checked against: tensor cores would round P
// and dS to 16 bits) and for the other head dims (tensor-core tiles come in
// steps of 16 dims, and no model we run uses them, so they are not worth a
// third set of instantiations).
//
// Work split (a warp is 32 lanes; "rows" are query rows, "keys" key rows):
//  * forward and dQ: a block of 4 warps owns 16 query rows of one (b, h); each
//    warp owns 4 rows. Keys come in tiles of 32 through shared memory, one key
//    per lane for the dot products; each lane owns head dims lane + 32c.
//  * dK/dV: a block owns 16 keys of one (b, g); it walks the query heads of g
//    in head order and the query tiles in order, so the sums over queries and
//    heads are deterministic without atomics.
// Legend: B batch, T sequence, H query heads, G kv heads, D head dim (<= 128),
// W = (H + 2G)·D the width of one token's qkv row.
#include "backends/cuda/kernels/attention_layout.cuh"
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // 16 query rows (or keys) per block
constexpr int kTileKeys = 32;                 // keys (or queries) per shared tile
constexpr int kDimsPerLane = kMaxHeadDim / 32;

// dst[r][d] (row stride `stride`) = src row `first + r`, zero past T.
template <class T>
__device__ void load_rows(float* dst, int stride, int rows, const T* base, i64 first, i64 Tn,
                          i64 row_stride, i64 D) {
  for (i64 idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const i64 r = idx / D, d = idx % D, t = first + r;
    dst[r * stride + d] = t < Tn ? to_float(base[t * row_stride + d]) : 0.f;
  }
}

__device__ float dot_row(const float* a, const float* b, i64 D) {
  float s = 0.f;
  for (i64 d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

template <class T>
__global__ void attention_fwd_kernel(const T* qkv, T* out, float* lse, AttentionLayout L, float scale) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(L.D), KS = D + 1;
  float* qs = smem;                    // [kRows][D]
  float* ks = qs + kRows * D;          // [kTileKeys][D + 1]
  float* vs = ks + kTileKeys * KS;     // [kTileKeys][D]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 first = static_cast<i64>(blockIdx.x) * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  load_rows(qs, D, kRows, qkv + L.q(b, 0, h), first, L.T, L.W, D);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    for (int c = 0; c < kDimsPerLane; ++c) o[r][c] = 0.f;
  }
  const i64 last = min(L.T - 1, first + kRows - 1);
  for (i64 k0 = 0; k0 <= last; k0 += kTileKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_rows(ks, KS, kTileKeys, qkv + L.k(b, 0, g), k0, L.T, L.W, D);
    load_rows(vs, D, kTileKeys, qkv + L.v(b, 0, g), k0, L.T, L.W, D);
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const i64 t = first + row, j = k0 + lane;
      if (t >= L.T || k0 > t) continue;  // uniform over the warp
      const float s = j <= t ? scale * dot_row(qs + row * D, ks + lane * KS, D) : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));
      const float p = expf(s - m_new);
      const float corr = expf(m[r] - m_new);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = m_new;
      for (int c = 0; c < kDimsPerLane; ++c) o[r][c] *= corr;
      for (int jj = 0; jj < kTileKeys; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        for (int c = 0; c < kDimsPerLane; ++c) {
          const int d = lane + 32 * c;
          if (d < D) o[r][c] += pj * vs[jj * D + d];
        }
      }
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const i64 t = first + warp * kRowsPerWarp + r;
    if (t >= L.T) continue;
    const float inv = 1.f / l[r];
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < D) out[L.o(b, t, h) + d] = from_float<T>(o[r][c] * inv);
    }
    if (lane == 0) lse[L.l(b, h, t)] = m[r] + logf(l[r]);
  }
}

// di (B, H, T) = dO · O per query row: one warp per row.
template <class T>
__global__ void attention_di_kernel(const T* dout, const T* out, float* di, AttentionLayout L, i64 B) {
  const i64 row = blockIdx.x * (i64)(blockDim.x / 32) + (threadIdx.x >> 5);  // (b, t, h)
  const int lane = threadIdx.x & 31;
  if (row >= B * L.T * L.H) return;
  const i64 h = row % L.H, bt = row / L.H, b = bt / L.T, t = bt % L.T;
  float s = 0.f;
  for (i64 d = lane; d < L.D; d += 32) s += to_float(dout[row * L.D + d]) * to_float(out[row * L.D + d]);
  s = warp_sum(s);
  if (lane == 0) di[L.l(b, h, t)] = s;
}

template <class T>
__global__ void attention_dq_kernel(const T* dout, const T* qkv, const float* lse, const float* di,
                                    T* dqkv, AttentionLayout L, float scale) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(L.D), KS = D + 1;
  float* qs = smem;                   // [kRows][D]
  float* dos = qs + kRows * D;        // [kRows][D]
  float* ks = dos + kRows * D;        // [kTileKeys][D + 1]
  float* vs = ks + kTileKeys * KS;    // [kTileKeys][D + 1]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 first = static_cast<i64>(blockIdx.x) * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  load_rows(qs, D, kRows, qkv + L.q(b, 0, h), first, L.T, L.W, D);
  load_rows(dos, D, kRows, dout + L.o(b, 0, h), first, L.T, L.H * L.D, D);
  float row_lse[kRowsPerWarp], row_di[kRowsPerWarp], dq[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const i64 t = first + warp * kRowsPerWarp + r;
    row_lse[r] = t < L.T ? lse[L.l(b, h, t)] : 0.f;
    row_di[r] = t < L.T ? di[L.l(b, h, t)] : 0.f;
    for (int c = 0; c < kDimsPerLane; ++c) dq[r][c] = 0.f;
  }
  const i64 last = min(L.T - 1, first + kRows - 1);
  for (i64 k0 = 0; k0 <= last; k0 += kTileKeys) {
    __syncthreads();
    load_rows(ks, KS, kTileKeys, qkv + L.k(b, 0, g), k0, L.T, L.W, D);
    load_rows(vs, KS, kTileKeys, qkv + L.v(b, 0, g), k0, L.T, L.W, D);
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const i64 t = first + row, j = k0 + lane;
      if (t >= L.T || k0 > t) continue;
      float ds = 0.f;
      if (j <= t) {
        const float p = expf(scale * dot_row(qs + row * D, ks + lane * KS, D) - row_lse[r]);
        ds = p * (dot_row(dos + row * D, vs + lane * KS, D) - row_di[r]);
      }
      for (int jj = 0; jj < kTileKeys; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
        for (int c = 0; c < kDimsPerLane; ++c) {
          const int d = lane + 32 * c;
          if (d < D) dq[r][c] += dsj * ks[jj * KS + d];
        }
      }
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const i64 t = first + warp * kRowsPerWarp + r;
    if (t >= L.T) continue;
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < D) dqkv[L.q(b, t, h) + d] = from_float<T>(scale * dq[r][c]);
    }
  }
}

template <class T>
__global__ void attention_dkv_kernel(const T* dout, const T* qkv, const float* lse, const float* di,
                                     T* dqkv, AttentionLayout L, float scale) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(L.D), QS = D + 1;
  float* ks = smem;                    // [kRows][D]
  float* vs = ks + kRows * D;          // [kRows][D]
  float* qs = vs + kRows * D;          // [kTileKeys][D + 1] query rows
  float* dos = qs + kTileKeys * QS;    // [kTileKeys][D + 1]
  float* ls = dos + kTileKeys * QS;    // [kTileKeys]
  float* dis = ls + kTileKeys;         // [kTileKeys]
  const i64 bg = blockIdx.y, b = bg / L.G, g = bg % L.G, R = L.H / L.G;
  const i64 first = static_cast<i64>(blockIdx.x) * kRows;  // first key of the block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  load_rows(ks, D, kRows, qkv + L.k(b, 0, g), first, L.T, L.W, D);
  load_rows(vs, D, kRows, qkv + L.v(b, 0, g), first, L.T, L.W, D);
  float dk[kRowsPerWarp][kDimsPerLane], dv[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r)
    for (int c = 0; c < kDimsPerLane; ++c) dk[r][c] = dv[r][c] = 0.f;
  for (i64 h = g * R; h < (g + 1) * R; ++h) {
    for (i64 q0 = first / kTileKeys * kTileKeys; q0 < L.T; q0 += kTileKeys) {
      __syncthreads();
      load_rows(qs, QS, kTileKeys, qkv + L.q(b, 0, h), q0, L.T, L.W, D);
      load_rows(dos, QS, kTileKeys, dout + L.o(b, 0, h), q0, L.T, L.H * L.D, D);
      if (threadIdx.x < kTileKeys) {
        const i64 i = q0 + threadIdx.x;
        ls[threadIdx.x] = i < L.T ? lse[L.l(b, h, i)] : 0.f;
        dis[threadIdx.x] = i < L.T ? di[L.l(b, h, i)] : 0.f;
      }
      __syncthreads();
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int key = warp * kRowsPerWarp + r;
        const i64 j = first + key, i = q0 + lane;
        if (j >= L.T || q0 + kTileKeys <= j) continue;  // no query of the tile sees key j
        float p = 0.f, ds = 0.f;
        if (i < L.T && i >= j) {
          p = expf(scale * dot_row(qs + lane * QS, ks + key * D, D) - ls[lane]);
          ds = p * (dot_row(dos + lane * QS, vs + key * D, D) - dis[lane]);
        }
        for (int ii = 0; ii < kTileKeys; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii);
          const float dsi = __shfl_sync(0xffffffffu, ds, ii);
          for (int c = 0; c < kDimsPerLane; ++c) {
            const int d = lane + 32 * c;
            if (d < D) {
              dv[r][c] += pi * dos[ii * QS + d];
              dk[r][c] += dsi * qs[ii * QS + d];
            }
          }
        }
      }
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const i64 j = first + warp * kRowsPerWarp + r;
    if (j >= L.T) continue;
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < D) {
        dqkv[L.k(b, j, g) + d] = from_float<T>(scale * dk[r][c]);
        dqkv[L.v(b, j, g) + d] = from_float<T>(dv[r][c]);
      }
    }
  }
}

template <class T>
cudaError_t forward(const void* qkv, void* out, float* lse, const AttentionShape& d, cudaStream_t s) {
  const AttentionLayout L = attention_layout(d);
  const std::size_t smem = sizeof(float) * (kRows * d.D + kTileKeys * (d.D + 1) + kTileKeys * d.D);
  const dim3 grid(static_cast<unsigned>((d.T + kRows - 1) / kRows), static_cast<unsigned>(d.B * d.H));
  return launch_with_smem(attention_fwd_kernel<T>, grid, kWarps * 32, smem, s,
                          static_cast<const T*>(qkv), static_cast<T*>(out), lse, L, d.scale);
}

template <class T>
cudaError_t backward(const void* dout, const void* qkv, const void* out, const float* lse,
                     void* dqkv, const AttentionShape& d, int dtype, float* di, cudaStream_t s) {
  const AttentionLayout L = attention_layout(d);
  const T* pd = static_cast<const T*>(dout);
  const T* pq = static_cast<const T*>(qkv);
  const i64 rows = d.B * d.T * d.H;
  attention_di_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
      pd, static_cast<const T*>(out), di, L, d.B);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (attention_tc_supported(d, dtype, {dout, qkv, dqkv}))
    return attention_backward_tc(dout, qkv, lse, di, dqkv, d, dtype, s);
  const unsigned tiles = static_cast<unsigned>((d.T + kRows - 1) / kRows);
  const std::size_t smem_q = sizeof(float) * (2 * kRows * d.D + 2 * kTileKeys * (d.D + 1));
  e = launch_with_smem(attention_dq_kernel<T>, dim3(tiles, static_cast<unsigned>(d.B * d.H)),
                       kWarps * 32, smem_q, s, pd, pq, lse, static_cast<const float*>(di),
                       static_cast<T*>(dqkv), L, d.scale);
  if (e != cudaSuccess) return e;
  const std::size_t smem_kv =
      sizeof(float) * (2 * kRows * d.D + 2 * kTileKeys * (d.D + 1) + 2 * kTileKeys);
  return launch_with_smem(attention_dkv_kernel<T>, dim3(tiles, static_cast<unsigned>(d.B * d.G)),
                          kWarps * 32, smem_kv, s, pd, pq, lse, static_cast<const float*>(di),
                          static_cast<T*>(dqkv), L, d.scale);
}

}  // namespace

cudaError_t attention_forward(const void* qkv, void* out, float* lse, const AttentionShape& d,
                              int dtype, cudaStream_t s) {
  if (d.B * d.T * d.H == 0) return cudaGetLastError();
  if (attention_tc_supported(d, dtype, {qkv, out})) return attention_forward_tc(qkv, out, lse, d, dtype, s);
  return with_storage(dtype, [&](auto tag) {
    return forward<typename decltype(tag)::type>(qkv, out, lse, d, s);
  });
}

cudaError_t attention_backward(const void* dout, const void* qkv, const void* out,
                               const float* lse, void* dqkv, const AttentionShape& d, int dtype,
                               float* scratch, cudaStream_t s) {
  if (d.B * d.T * d.H == 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    return backward<typename decltype(tag)::type>(dout, qkv, out, lse, dqkv, d, dtype, scratch, s);
  });
}

}  // namespace meshtrain::cuda::kernels
