// Grouped-query flash attention, causal or not, with the optional additive
// score terms of AttentionOp (a per-head bias shared by the batch, a
// per-window mask), forward and backward, fp32, bf16 or fp16 storage with
// fp32 math. Nothing of size T×T is stored: forward keeps an online softmax
// per query row and saves its log-sum-exp; backward recomputes the
// probabilities from it (as backends/cpu/kernels/attention.h does). The one
// exception is the bias gradient: the dQ kernel stores every dS (B, H, T, T)
// into scratch, and attention_dbias sums it over the batch in ascending order
// (no float atomics, so the same bits every run).
//
// A query window (context parallelism: AttentionShape::q0, Q) computes only
// its rows' outputs, against every key they read; the dK/dV kernel sums over
// the window's queries only, and the window's dQ kernel leaves the query rows
// outside it to zero_query_rows_kernel. Windows take these kernels.
//
// These are the CUDA-core kernels. 16-bit storage with D = 64 or 128 and no
// bias, mask or query window takes the tensor-core kernels of attention_tc.cu instead;
// these stay for fp32 (the exact mode the cpu backend is checked against:
// tensor cores would round P and dS to 16 bits), for the other head dims
// (tensor-core tiles come in steps of 16 dims, and no model we run uses them,
// so they are not worth a third set of instantiations), and for a bias or a
// mask (Swin's window attention, whose head dim is 32 anyway).
//
// Work split (a warp is 32 lanes; "rows" are query rows, "keys" key rows):
//  * forward and dQ: a block of 4 warps owns 16 query rows of one (b, h); each
//    warp owns 4 rows. Keys come in tiles of 32 through shared memory, one key
//    per lane for the dot products; each lane owns head dims lane + 32c.
//  * dK/dV: a block owns 16 keys of one (b, g); it walks the query heads of g
//    in head order and the query tiles in order, so the sums over queries and
//    heads are deterministic without atomics.
// Legend: B batch, T sequence, H query heads, G kv heads, D head dim (<= 128),
// W = (H + 2G)·D the width of one token's qkv row, M mask windows.
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

// The additive terms of one (b, h): head h's (T, T) bias and window b mod M's
// (T, T) mask, either null.
struct TermRows {
  const float* bias;
  const float* mask;
  // The score of query i and key j: the scaled dot product plus the terms,
  // added in the cpu backend's order.
  __device__ float add(float s, i64 i, i64 j, i64 T) const {
    if (bias != nullptr) s += bias[i * T + j];
    if (mask != nullptr) s += mask[i * T + j];
    return s;
  }
};
__device__ TermRows term_rows(const AttentionTerms& a, i64 T, i64 b, i64 h) {
  return TermRows{a.bias != nullptr ? a.bias + h * T * T : nullptr,
                  a.mask != nullptr ? a.mask + (b % a.windows) * T * T : nullptr};
}
// The last key any of the query rows first..first + rows - 1 reads.
__device__ i64 last_key(const AttentionTerms& a, i64 T, i64 first, i64 rows) {
  return a.causal ? min(T - 1, first + rows - 1) : T - 1;
}

template <class T>
__global__ void attention_fwd_kernel(const T* qkv, T* out, float* lse, AttentionLayout L, float scale,
                                     AttentionTerms terms) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(L.D), KS = D + 1;
  float* qs = smem;                    // [kRows][D]
  float* ks = qs + kRows * D;          // [kTileKeys][D + 1]
  float* vs = ks + kTileKeys * KS;     // [kTileKeys][D]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 first = L.Q0 + static_cast<i64>(blockIdx.x) * kRows, end = L.query_end();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  const TermRows tr = term_rows(terms, L.T, b, h);

  load_rows(qs, D, kRows, qkv + L.q(b, 0, h), first, end, L.W, D);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    for (int c = 0; c < kDimsPerLane; ++c) o[r][c] = 0.f;
  }
  const i64 last = last_key(terms, L.T, first, kRows);
  for (i64 k0 = 0; k0 <= last; k0 += kTileKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_rows(ks, KS, kTileKeys, qkv + L.k(b, 0, g), k0, L.T, L.W, D);
    load_rows(vs, D, kTileKeys, qkv + L.v(b, 0, g), k0, L.T, L.W, D);
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const i64 t = first + row, j = k0 + lane;
      if (t >= end || (terms.causal && k0 > t)) continue;  // uniform over the warp
      const bool seen = j < L.T && (!terms.causal || j <= t);
      const float s =
          seen ? tr.add(scale * dot_row(qs + row * D, ks + lane * KS, D), t, j, L.T) : -INFINITY;
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
    if (t >= end) continue;
    const float inv = 1.f / l[r];
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < D) out[L.o(b, t, h) + d] = from_float<T>(o[r][c] * inv);
    }
    if (lane == 0) lse[L.l(b, h, t)] = m[r] + logf(l[r]);
  }
}

// di (B, H, window rows) = dO · O per query row: one warp per row.
template <class T>
__global__ void attention_di_kernel(const T* dout, const T* out, float* di, AttentionLayout L, i64 B) {
  const i64 row = blockIdx.x * (i64)(blockDim.x / 32) + (threadIdx.x >> 5);  // (b, window row, h)
  const int lane = threadIdx.x & 31;
  if (row >= B * L.QN * L.H) return;
  const i64 h = row % L.H, bt = row / L.H, b = bt / L.QN, t = L.Q0 + bt % L.QN;
  float s = 0.f;
  for (i64 d = lane; d < L.D; d += 32) s += to_float(dout[row * L.D + d]) * to_float(out[row * L.D + d]);
  s = warp_sum(s);
  if (lane == 0) di[L.l(b, h, t)] = s;
}

template <class T>
__global__ void attention_dq_kernel(const T* dout, const T* qkv, const float* lse, const float* di,
                                    T* dqkv, AttentionLayout L, float scale, AttentionTerms terms) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(L.D), KS = D + 1;
  float* qs = smem;                   // [kRows][D]
  float* dos = qs + kRows * D;        // [kRows][D]
  float* ks = dos + kRows * D;        // [kTileKeys][D + 1]
  float* vs = ks + kTileKeys * KS;    // [kTileKeys][D + 1]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 first = L.Q0 + static_cast<i64>(blockIdx.x) * kRows, end = L.query_end();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  const TermRows tr = term_rows(terms, L.T, b, h);
  // dS of (b, h), row-major (T, T), when the caller keeps it (the bias gradient).
  float* dsb = terms.dscores != nullptr ? terms.dscores + bh * L.T * L.T : nullptr;

  load_rows(qs, D, kRows, qkv + L.q(b, 0, h), first, end, L.W, D);
  load_rows(dos, D, kRows, dout + L.o(b, L.Q0, h), first - L.Q0, L.QN, L.H * L.D, D);
  float row_lse[kRowsPerWarp], row_di[kRowsPerWarp], dq[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const i64 t = first + warp * kRowsPerWarp + r;
    row_lse[r] = t < end ? lse[L.l(b, h, t)] : 0.f;
    row_di[r] = t < end ? di[L.l(b, h, t)] : 0.f;
    for (int c = 0; c < kDimsPerLane; ++c) dq[r][c] = 0.f;
  }
  const i64 last = last_key(terms, L.T, first, kRows);
  for (i64 k0 = 0; k0 <= last; k0 += kTileKeys) {
    __syncthreads();
    load_rows(ks, KS, kTileKeys, qkv + L.k(b, 0, g), k0, L.T, L.W, D);
    load_rows(vs, KS, kTileKeys, qkv + L.v(b, 0, g), k0, L.T, L.W, D);
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const i64 t = first + row, j = k0 + lane;
      if (t >= end || (terms.causal && k0 > t)) continue;
      float ds = 0.f;
      if (j < L.T && (!terms.causal || j <= t)) {
        const float s = tr.add(scale * dot_row(qs + row * D, ks + lane * KS, D), t, j, L.T);
        const float p = expf(s - row_lse[r]);
        ds = p * (dot_row(dos + row * D, vs + lane * KS, D) - row_di[r]);
      }
      if (dsb != nullptr && j < L.T) dsb[t * L.T + j] = ds;
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
    if (t >= end) continue;
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < D) dqkv[L.q(b, t, h) + d] = from_float<T>(scale * dq[r][c]);
    }
  }
}

template <class T>
__global__ void attention_dkv_kernel(const T* dout, const T* qkv, const float* lse, const float* di,
                                     T* dqkv, AttentionLayout L, float scale, AttentionTerms terms) {
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
  const i64 end = L.query_end();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Query tiles start at the window's first row. Causal: queries before the
  // block's first key see none of its keys.
  const i64 q_start = L.Q0 + (terms.causal && first > L.Q0 ? (first - L.Q0) / kTileKeys * kTileKeys : 0);

  load_rows(ks, D, kRows, qkv + L.k(b, 0, g), first, L.T, L.W, D);
  load_rows(vs, D, kRows, qkv + L.v(b, 0, g), first, L.T, L.W, D);
  float dk[kRowsPerWarp][kDimsPerLane], dv[kRowsPerWarp][kDimsPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r)
    for (int c = 0; c < kDimsPerLane; ++c) dk[r][c] = dv[r][c] = 0.f;
  for (i64 h = g * R; h < (g + 1) * R; ++h) {
    const TermRows tr = term_rows(terms, L.T, b, h);
    for (i64 q0 = q_start; q0 < end; q0 += kTileKeys) {
      __syncthreads();
      load_rows(qs, QS, kTileKeys, qkv + L.q(b, 0, h), q0, end, L.W, D);
      load_rows(dos, QS, kTileKeys, dout + L.o(b, L.Q0, h), q0 - L.Q0, L.QN, L.H * L.D, D);
      if (threadIdx.x < kTileKeys) {
        const i64 i = q0 + threadIdx.x;
        ls[threadIdx.x] = i < end ? lse[L.l(b, h, i)] : 0.f;
        dis[threadIdx.x] = i < end ? di[L.l(b, h, i)] : 0.f;
      }
      __syncthreads();
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int key = warp * kRowsPerWarp + r;
        const i64 j = first + key, i = q0 + lane;
        if (j >= L.T || (terms.causal && q0 + kTileKeys <= j)) continue;  // no query of the tile sees key j
        float p = 0.f, ds = 0.f;
        if (i < end && (!terms.causal || i >= j)) {
          p = expf(tr.add(scale * dot_row(qs + lane * QS, ks + key * D, D), i, j, L.T) - ls[lane]);
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

// dqkv's query rows outside the window [Q0, Q0 + QN) = 0 (the rows no loss
// term reaches); one thread per element.
template <class T>
__global__ void zero_query_rows_kernel(T* dqkv, AttentionLayout L, i64 B) {
  const i64 outside = L.T - L.QN, n = B * outside * L.H * L.D;
  for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
    const i64 d = idx % L.D, r = idx / L.D, h = r % L.H, bu = r / L.H, b = bu / outside, u = bu % outside;
    const i64 t = u < L.Q0 ? u : u + L.QN;
    dqkv[L.q(b, t, h) + d] = from_float<T>(0.f);
  }
}

// out (H, T, T) = bias (T, T, H) heads first; one thread per output.
__global__ void attention_bias_kernel(const void* bias, int dtype, float* out, i64 T, i64 H) {
  const i64 TT = T * T;
  for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < H * TT;
       idx += (i64)gridDim.x * blockDim.x) {
    const i64 h = idx / TT, ij = idx % TT;
    out[idx] = load_as_float(bias, dtype, ij * H + h);
  }
}

// dbias (T, T, H) = Σ_b ds (B, H, T, T): one thread per (h, i, j), the batch
// summed in ascending order in double (as the cpu backend does); consecutive
// threads read consecutive (i, j) of one head.
__global__ void attention_dbias_kernel(const float* ds, float* dbias, i64 B, i64 H, i64 T,
                                       bool causal) {
  const i64 TT = T * T;
  for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < H * TT;
       idx += (i64)gridDim.x * blockDim.x) {
    const i64 h = idx / TT, ij = idx % TT;
    double acc = 0.0;
    if (!causal || ij % T <= ij / T)  // above the diagonal dS is zero (and unwritten)
      for (i64 b = 0; b < B; ++b) acc += static_cast<double>(ds[(b * H + h) * TT + ij]);
    dbias[ij * H + h] = static_cast<float>(acc);
  }
}

template <class T>
cudaError_t forward(const void* qkv, void* out, float* lse, const AttentionShape& d,
                    const AttentionTerms& terms, cudaStream_t s) {
  const AttentionLayout L = attention_layout(d);
  const std::size_t smem = sizeof(float) * (kRows * d.D + kTileKeys * (d.D + 1) + kTileKeys * d.D);
  const dim3 grid(static_cast<unsigned>((d.rows() + kRows - 1) / kRows), static_cast<unsigned>(d.B * d.H));
  return launch_with_smem(attention_fwd_kernel<T>, grid, kWarps * 32, smem, s,
                          static_cast<const T*>(qkv), static_cast<T*>(out), lse, L, d.scale, terms);
}

template <class T>
cudaError_t backward(const void* dout, const void* qkv, const void* out, const float* lse,
                     void* dqkv, const AttentionShape& d, const AttentionTerms& terms, int dtype,
                     float* di, cudaStream_t s) {
  const AttentionLayout L = attention_layout(d);
  const T* pd = static_cast<const T*>(dout);
  const T* pq = static_cast<const T*>(qkv);
  const i64 rows = d.B * d.rows() * d.H;
  attention_di_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
      pd, static_cast<const T*>(out), di, L, d.B);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (attention_tc_supported(d, dtype, terms, {dout, qkv, dqkv}))
    return attention_backward_tc(dout, qkv, lse, di, dqkv, d, terms.causal, terms.tuned_tc, dtype, s);
  if (d.rows() < d.T) {
    const i64 outside = d.B * (d.T - d.rows()) * d.H * d.D;
    zero_query_rows_kernel<T><<<grid_for(outside), kThreads, 0, s>>>(static_cast<T*>(dqkv), L, d.B);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const unsigned row_tiles = static_cast<unsigned>((d.rows() + kRows - 1) / kRows);
  const unsigned tiles = static_cast<unsigned>((d.T + kRows - 1) / kRows);
  const std::size_t smem_q = sizeof(float) * (2 * kRows * d.D + 2 * kTileKeys * (d.D + 1));
  e = launch_with_smem(attention_dq_kernel<T>, dim3(row_tiles, static_cast<unsigned>(d.B * d.H)),
                       kWarps * 32, smem_q, s, pd, pq, lse, static_cast<const float*>(di),
                       static_cast<T*>(dqkv), L, d.scale, terms);
  if (e != cudaSuccess) return e;
  const std::size_t smem_kv =
      sizeof(float) * (2 * kRows * d.D + 2 * kTileKeys * (d.D + 1) + 2 * kTileKeys);
  return launch_with_smem(attention_dkv_kernel<T>, dim3(tiles, static_cast<unsigned>(d.B * d.G)),
                          kWarps * 32, smem_kv, s, pd, pq, lse, static_cast<const float*>(di),
                          static_cast<T*>(dqkv), L, d.scale, terms);
}

}  // namespace

cudaError_t attention_bias_heads_first(const void* bias, int dtype, float* out, i64 T, i64 H,
                                       cudaStream_t s) {
  if (T * T * H > 0) attention_bias_kernel<<<grid_for(T * T * H), kThreads, 0, s>>>(bias, dtype, out, T, H);
  return cudaGetLastError();
}

cudaError_t attention_forward(const void* qkv, void* out, float* lse, const AttentionShape& d,
                              const AttentionTerms& terms, int dtype, cudaStream_t s) {
  if (d.B * d.T * d.H == 0) return cudaGetLastError();
  if (attention_tc_supported(d, dtype, terms, {qkv, out}))
    return attention_forward_tc(qkv, out, lse, d, terms.causal, terms.tuned_tc, dtype, s);
  return with_storage(dtype, [&](auto tag) {
    return forward<typename decltype(tag)::type>(qkv, out, lse, d, terms, s);
  });
}

cudaError_t attention_backward(const void* dout, const void* qkv, const void* out,
                               const float* lse, void* dqkv, const AttentionShape& d,
                               const AttentionTerms& terms, int dtype, float* scratch,
                               cudaStream_t s) {
  if (d.B * d.T * d.H == 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    return backward<typename decltype(tag)::type>(dout, qkv, out, lse, dqkv, d, terms, dtype, scratch, s);
  });
}

cudaError_t attention_dbias(const float* dscores, float* dbias, i64 B, i64 H, i64 T, bool causal,
                            cudaStream_t s) {
  if (T * T * H > 0)
    attention_dbias_kernel<<<grid_for(T * T * H), kThreads, 0, s>>>(dscores, dbias, B, H, T, causal);
  return cudaGetLastError();
}

}  // namespace meshtrain::cuda::kernels
