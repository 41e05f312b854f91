// Tensor-core flash attention (FlashAttention-2 style) for bf16 and fp16
// storage with head dim 64 or 128; attention.cu dispatches here. Q·Kᵀ, P·V
// and the four backward products run as mma.sync m16n8k16 with fp32
// accumulators; the online softmax and the recomputed probabilities stay in
// fp32 registers. P and dS enter the tensor cores rounded to the storage type
// (as FlashAttention does), the one extra rounding against attention.cu.
// Causal (decoders) or not (encoders: ViT); a bias or a mask (Swin's window
// attention, head dim 32) stays on attention.cu's CUDA-core kernels, which
// attention_tc_supported leaves them to.
//
// Fragments (PTX ISA, mma.m16n8k16; lane = 4·gr + tq, gr = lane/4, tq = lane%4),
// (row, col) of the 16-bit pairs / fp32 values each lane holds:
//   A 16x16: a0 (gr, 2tq..+1)  a1 (gr+8, 2tq..+1)  a2 (gr, 2tq+8..+9)  a3 (gr+8, 2tq+8..+9)
//   B 16x8:  b0 (k 2tq..+1, n gr)  b1 (k 2tq+8..+9, n gr)
//   C 16x8:  c0,c1 (gr, 2tq..+1)  c2,c3 (gr+8, 2tq..+1)
// The C tiles of n-tiles 2j and 2j+1 are, packed in pairs, the A fragment of
// k-step j: P and dS feed the next product straight from registers.
//
// Two versions of each kernel, of the same arithmetic (AttentionTerms::tuned_tc
// picks): the reference loads fragments with 32-bit shared loads, reloads Q
// for every key tile and masks every score; the tuned one loads them with
// ldmatrix (one instruction for four 8x8 matrices), keeps the forward's Q
// fragments in registers, masks only the tiles that cross the diagonal or
// the sequence's end, and holds blocks per multiprocessor with launch bounds.
// The tuned one is unverified on a GPU until a run checks it bit for bit
// against the reference (tests/cuda/test_cuda_attention_tuned.cc).
//
// Work split: 4 warps, each owning 16 rows of the block's 64.
//  * forward: a block owns 64 query rows of one (b, h); key tiles of 64 (up
//    to the block's last row when causal, all T otherwise).
//  * dQ: a block owns 64 query rows of one (b, h); key tiles of kInner.
//  * dK/dV: a block owns 64 keys of one (b, g); warps hold Sᵀ (keys x
//    queries); it walks the heads of g in order and the query tiles of kInner
//    in order. Every sum has a fixed order and there are no atomics, so the
//    result is deterministic, as in attention.cu.
// Shared tiles are row-major with rows padded by kPad = 8 elements: the
// fragment loads (8 rows x 4 words) hit 32 distinct banks and ldmatrix rows
// stay 16-byte aligned.
// Legend: B batch, T sequence, H query heads, G kv heads, D head dim,
// W = (H + 2G)·D the width of one token's qkv row.
#include "backends/cuda/kernels/attention_layout.cuh"
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows (forward, dQ) or keys (dK/dV) per block
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The inner tile of the backward kernels: 32 at D = 128 keeps the dK and dV
// accumulators (2 x 64 fp32 per lane) plus Sᵀ and dPᵀ within 255 registers.
template <int D>
constexpr int kInner = D == 128 ? 32 : 64;

// Blocks per multiprocessor the tuned forward and dQ kernels are held to
// (dK/dV: one fewer): 4 at D = 64 caps a thread at 128 registers, 3 at D =
// 128 at 168. Left free, the compiler took a few registers more (129, 175)
// and lost a whole block of occupancy for it. The reference kernels: 0, no
// hold (their registers are those they always had).
template <int D, bool Tuned>
constexpr int kMinBlocks = !Tuned ? 0 : D == 64 ? 4 : 3;

// ---- tensor-core primitives ------------------------------------------------

template <class T>
__device__ __forceinline__ void mma(float c[4], const std::uint32_t a[4], const std::uint32_t b[2]);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float c[4], const std::uint32_t a[4],
                                                   const std::uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<__half>(float c[4], const std::uint32_t a[4],
                                            const std::uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 16-bit matrices, transposed: lane l gives the address of row l%8
// of matrix l/8; r[i] gets (M_iᵀ)(gr, 2tq..+1) = M_i(2tq..+1, gr).
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t r[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two fp32 values rounded to T, the first in the low half (the lower address).
template <class T>
__device__ __forceinline__ std::uint32_t pack(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// Four 8x8 16-bit matrices as they are: lane l gives the address of row l%8
// of matrix l/8; r[i] gets M_i(gr, 2tq..+1). One instruction in place of
// four 32-bit shared loads per lane: the score products were bound by the
// issue of those loads, not by the tensor cores.
__device__ __forceinline__ void ldsm_x4(std::uint32_t r[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class T>
__device__ __forceinline__ std::uint32_t word(const T* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// A fragment: rows r0.., cols k0.. of a row-major tile (row stride S).
// Tuned, matrices (r0, k0) -> a0, (r0 + 8, k0) -> a1, (r0, k0 + 8) -> a2,
// (r0 + 8, k0 + 8) -> a3; the reference loads the same words one by one.
template <bool Tuned, class T>
__device__ __forceinline__ void load_a(std::uint32_t a[4], const T* tile, int S, int r0, int k0,
                                       int lane) {
  if constexpr (Tuned) {
    const int m = lane >> 3, r = lane & 7;
    ldsm_x4(a, tile + (r0 + (m & 1) * 8 + r) * S + k0 + (m >> 1) * 8);
  } else {
    const T* p = tile + (r0 + (lane >> 2)) * S + k0 + 2 * (lane & 3);
    a[0] = word(p);
    a[1] = word(p + 8 * S);
    a[2] = word(p + 8);
    a[3] = word(p + 8 * S + 8);
  }
}

// B fragment with B(k, n) = tile(n0 + n, k0 + k): the tile's rows are B's
// columns (K or V for scores, Q or dO for the transposed scores). The
// reference kernels' loads, 32 bits at a time.
template <class T>
__device__ __forceinline__ void load_b_row(std::uint32_t b[2], const T* tile, int S, int n0, int k0, int lane) {
  const T* p = tile + (n0 + (lane >> 2)) * S + k0 + 2 * (lane & 3);
  b[0] = word(p);
  b[1] = word(p + 8);
}

// The same for n-tiles n0 and n0 + 8 in one ldmatrix (the tuned kernels):
// matrices (n0, k0) -> b0[0], (n0, k0 + 8) -> b0[1], (n0 + 8, k0) -> b1[0],
// (n0 + 8, k0 + 8) -> b1[1].
template <class T>
__device__ __forceinline__ void load_b_rows_x2(std::uint32_t b0[2], std::uint32_t b1[2], const T* tile, int S,
                                               int n0, int k0, int lane) {
  const int m = lane >> 3, r = lane & 7;
  std::uint32_t x[4];
  ldsm_x4(x, tile + (n0 + (m >> 1) * 8 + r) * S + k0 + (m & 1) * 8);
  b0[0] = x[0];
  b0[1] = x[1];
  b1[0] = x[2];
  b1[1] = x[3];
}

// c[n] += a · B for the N/8 n-tiles of B(k, n) = tile(n + ..., k0 + k).
template <bool Tuned, class T, int N>
__device__ __forceinline__ void score_tiles(float c[N / 8][4], const std::uint32_t a[4], const T* tile, int S,
                                            int k0, int lane) {
  if constexpr (Tuned) {
    for (int n = 0; n < N / 8; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_rows_x2(b0, b1, tile, S, n * 8, k0, lane);
      mma<T>(c[n], a, b0);
      mma<T>(c[n + 1], a, b1);
    }
  } else {
    for (int n = 0; n < N / 8; ++n) {
      std::uint32_t b[2];
      load_b_row(b, tile, S, n * 8, k0, lane);
      mma<T>(c[n], a, b);
    }
  }
}

// B fragments of n-tiles n0 and n0 + 8 with B(k, n) = tile(k0 + k, n0 + n):
// the tile's rows are B's rows (V, K, Q or dO as the right factor).
template <class T>
__device__ __forceinline__ void load_b_cols(std::uint32_t b0[2], std::uint32_t b1[2], const T* tile,
                                            int S, int k0, int n0, int lane) {
  const int m = lane >> 3, r = lane & 7;
  std::uint32_t x[4];
  ldsm_x4_trans(x, tile + (k0 + (m & 1) * 8 + r) * S + n0 + (m >> 1) * 8);
  b0[0] = x[0];
  b0[1] = x[1];
  b1[0] = x[2];
  b1[1] = x[3];
}

// The A fragment of k-step j from the fp32 C tiles c[2j], c[2j+1].
template <class T>
__device__ __forceinline__ void to_a(std::uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack<T>(lo[0], lo[1]);
  a[1] = pack<T>(lo[2], lo[3]);
  a[2] = pack<T>(hi[0], hi[1]);
  a[3] = pack<T>(hi[2], hi[3]);
}

// Reductions over the four lanes that share a fragment row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// tile(r, 0..D) = row first + r of base (row stride `stride` elements), zero
// from row `limit` on; 16-byte copies.
// The two score products of the backward kernels in one pass over the head
// dimension: c1 = A1·B1ᵀ and c2 = A2·B2ᵀ for the warp's 16 rows of the A
// tiles against the N rows of the B tiles (dQ: S = Q·Kᵀ and dP = dO·Vᵀ;
// dK/dV: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ). Tiles are row-major with row stride S.
template <bool Tuned, class T, int D, int N>
__device__ __forceinline__ void two_score_products(float c1[N / 8][4], float c2[N / 8][4],
                                                   const T* a1, const T* a2, const T* b1,
                                                   const T* b2, int S, int warp, int lane) {
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t f1[4], f2[4];
    load_a<Tuned>(f1, a1, S, warp * 16, kk * 16, lane);
    load_a<Tuned>(f2, a2, S, warp * 16, kk * 16, lane);
    if constexpr (Tuned) {
      score_tiles<Tuned, T, N>(c1, f1, b1, S, kk * 16, lane);
      score_tiles<Tuned, T, N>(c2, f2, b2, S, kk * 16, lane);
    } else {
      for (int n = 0; n < N / 8; ++n) {  // interleaved, as the reference always was
        std::uint32_t bb[2];
        load_b_row(bb, b1, S, n * 8, kk * 16, lane);
        mma<T>(c1[n], f1, bb);
        load_b_row(bb, b2, S, n * 8, kk * 16, lane);
        mma<T>(c2[n], f2, bb);
      }
    }
  }
}

// acc (16 rows x D, as D/8 n-tiles) += P · B, with P the warp's 16 x N fp32
// scores in accumulator layout (rounded to T, as FlashAttention does) and B
// the N x D tile (row stride S): forward O += P·V, dQ += dS·K.
template <class T, int D, int N>
__device__ __forceinline__ void accumulate_product(float acc[D / 8][4], float p[N / 8][4],
                                                   const T* b, int S, int lane) {
  for (int kk = 0; kk < N / 16; ++kk) {
    std::uint32_t a[4];
    to_a<T>(a, p[2 * kk], p[2 * kk + 1]);
    for (int d2 = 0; d2 < D / 16; ++d2) {
      std::uint32_t b0[2], b1[2];
      load_b_cols(b0, b1, b, S, kk * 16, d2 * 16, lane);
      mma<T>(acc[2 * d2], a, b0);
      mma<T>(acc[2 * d2 + 1], a, b1);
    }
  }
}

template <class T, int D>
__device__ void load_tile(T* tile, int rows, const T* base, i64 first, i64 limit, i64 stride) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += blockDim.x) {
    const int r = idx / kChunks, c = idx % kChunks;
    const i64 t = first + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t < limit) v = *reinterpret_cast<const uint4*>(base + t * stride + c * 8);
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + c * 8) = v;
  }
}

// ---- kernels ---------------------------------------------------------------

template <class T, int D, bool Tuned>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<D, Tuned>)
    fwd_tc_kernel(const T* qkv, T* out, float* lse, AttentionLayout L, float scale, bool causal) {
  constexpr int S = D + kPad, kKeys = 64, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kRows][S]
  T* ks = qs + kRows * S;                  // [kKeys][S]
  T* vs = ks + kKeys * S;                  // [kKeys][S]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 q0 = static_cast<i64>(gridDim.x - 1 - blockIdx.x) * kRows;  // longest rows first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const i64 row[2] = {q0 + warp * 16 + (lane >> 2), q0 + warp * 16 + (lane >> 2) + 8};
  // The last key each row reads (a row past T keeps keys < T, so no row is all -inf).
  const i64 hi[2] = {causal ? row[0] : L.T - 1, causal ? row[1] : L.T - 1};
  const float c = scale * kLog2e;  // scores in the log2 domain

  load_tile<T, D>(qs, kRows, qkv + L.q(b, 0, h), q0, L.T, L.W);
  __syncthreads();
  // Tuned, the warp's Q fragments stay in registers for every key tile.
  std::uint32_t qa[Tuned ? D / 16 : 1][4];
  if constexpr (Tuned)
    for (int kk = 0; kk < D / 16; ++kk) load_a<Tuned>(qa[kk], qs, S, warp * 16, kk * 16, lane);
  float o[kDt][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const i64 last = causal ? min(L.T - 1, q0 + kRows - 1) : L.T - 1;
  const i64 first_row = q0 + warp * 16;  // the warp's first query row
  for (i64 k0 = 0; k0 <= last; k0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<T, D>(ks, kKeys, qkv + L.k(b, 0, g), k0, L.T, L.W);
    load_tile<T, D>(vs, kKeys, qkv + L.v(b, 0, g), k0, L.T, L.W);
    __syncthreads();
    float s[kKeys / 8][4] = {};
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t* a = qa[Tuned ? kk : 0];
      if constexpr (!Tuned) load_a<Tuned>(a, qs, S, warp * 16, kk * 16, lane);
      score_tiles<Tuned, T, kKeys>(s, a, ks, S, kk * 16, lane);
    }
    float mx[2] = {m[0], m[1]};
    // Only a tile that crosses the diagonal or the sequence's end masks
    // (warp-uniform): elsewhere every key is read, and the scores are the same.
    const bool masked = !Tuned || (causal && k0 + kKeys - 1 > first_row) || k0 + kKeys > L.T;
    for (int n = 0; n < kKeys / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        if (masked) {
          const i64 j = k0 + n * 8 + 2 * tq + (e & 1);
          s[n][e] = (j <= hi[e >> 1] && j < L.T) ? s[n][e] * c : -INFINITY;
        } else {
          s[n][e] *= c;
        }
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float corr[2];
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      corr[r] = exp2f(m[r] - mx[r]);  // 0 on the first tile (m = -inf)
      m[r] = mx[r];
      l[r] *= corr[r];  // this lane's partial row sum; the quad's sum at the end
    }
    for (int n = 0; n < kKeys / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m[e >> 1]);
        l[e >> 1] += s[n][e];
      }
    for (int d = 0; d < kDt; ++d) {
      o[d][0] *= corr[0];
      o[d][1] *= corr[0];
      o[d][2] *= corr[1];
      o[d][3] *= corr[1];
    }
    accumulate_product<T, D, kKeys>(o, s, vs, S, lane);
  }
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    if (row[r] >= L.T) continue;
    const float inv = 1.f / l[r];
    T* dst = out + L.o(b, row[r], h) + 2 * tq;
    for (int d = 0; d < kDt; ++d)
      *reinterpret_cast<std::uint32_t*>(dst + d * 8) = pack<T>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    if (tq == 0) lse[L.l(b, h, row[r])] = (m[r] + log2f(l[r])) * kLn2;
  }
}

template <class T, int D, bool Tuned>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<D, Tuned>)
    dq_tc_kernel(const T* dout, const T* qkv, const float* lse, const float* di, T* dqkv, AttentionLayout L,
                 float scale, bool causal) {
  constexpr int S = D + kPad, kKeys = kInner<D>, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kRows][S]
  T* dos = qs + kRows * S;                 // [kRows][S]
  T* ks = dos + kRows * S;                 // [kKeys][S]
  T* vs = ks + kKeys * S;                  // [kKeys][S]
  const i64 bh = blockIdx.y, b = bh / L.H, h = bh % L.H, g = h / (L.H / L.G);
  const i64 q0 = static_cast<i64>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const i64 row[2] = {q0 + warp * 16 + (lane >> 2), q0 + warp * 16 + (lane >> 2) + 8};
  const i64 hi[2] = {causal ? row[0] : L.T - 1, causal ? row[1] : L.T - 1};  // last key read
  const float c = scale * kLog2e;

  load_tile<T, D>(qs, kRows, qkv + L.q(b, 0, h), q0, L.T, L.W);
  load_tile<T, D>(dos, kRows, dout + L.o(b, 0, h), q0, L.T, L.H * L.D);
  float lse2[2], dii[2];
  for (int r = 0; r < 2; ++r) {
    lse2[r] = row[r] < L.T ? lse[L.l(b, h, row[r])] * kLog2e : 0.f;
    dii[r] = row[r] < L.T ? di[L.l(b, h, row[r])] : 0.f;
  }
  float dq[kDt][4] = {};
  const i64 last = causal ? min(L.T - 1, q0 + kRows - 1) : L.T - 1;
  const i64 first_row = q0 + warp * 16;  // the warp's first query row
  for (i64 k0 = 0; k0 <= last; k0 += kKeys) {
    __syncthreads();
    load_tile<T, D>(ks, kKeys, qkv + L.k(b, 0, g), k0, L.T, L.W);
    load_tile<T, D>(vs, kKeys, qkv + L.v(b, 0, g), k0, L.T, L.W);
    __syncthreads();
    float s[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
    two_score_products<Tuned, T, D, kKeys>(s, dp, qs, dos, ks, vs, S, warp, lane);
    // Masks only on a tile that crosses the diagonal (or, not causal, the
    // sequence's end) or holds rows past T (warp-uniform); the rest is the same arithmetic.
    const bool masked =
        !Tuned || (causal ? k0 + kKeys - 1 > first_row : k0 + kKeys > L.T) || first_row + 15 >= L.T;
    for (int n = 0; n < kKeys / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const i64 j = k0 + n * 8 + 2 * tq + (e & 1);
        const float p =
            (!masked || (j <= hi[r] && row[r] < L.T)) ? exp2f(s[n][e] * c - lse2[r]) : 0.f;
        s[n][e] = p * (dp[n][e] - dii[r]);  // dS
      }
    accumulate_product<T, D, kKeys>(dq, s, ks, S, lane);
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= L.T) continue;
    T* dst = dqkv + L.q(b, row[r], h) + 2 * tq;
    for (int d = 0; d < kDt; ++d)
      *reinterpret_cast<std::uint32_t*>(dst + d * 8) =
          pack<T>(scale * dq[d][2 * r], scale * dq[d][2 * r + 1]);
  }
}

template <class T, int D, bool Tuned>
__global__ void __launch_bounds__(kWarps * 32, Tuned ? kMinBlocks<D, Tuned> - 1 : 0)
    dkv_tc_kernel(const T* dout, const T* qkv, const float* lse, const float* di, T* dqkv, AttentionLayout L,
                  float scale, bool causal) {
  constexpr int S = D + kPad, kQueries = kInner<D>, kDt = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* ks = reinterpret_cast<T*>(smem_raw);  // [kRows][S]
  T* vs = ks + kRows * S;                  // [kRows][S]
  T* qs = vs + kRows * S;                  // [kQueries][S]
  T* dos = qs + kQueries * S;              // [kQueries][S]
  float* ls = reinterpret_cast<float*>(dos + kQueries * S);  // [kQueries] lse · log2 e
  float* dis = ls + kQueries;                                // [kQueries]
  const i64 bg = blockIdx.y, b = bg / L.G, g = bg % L.G, R = L.H / L.G;
  const i64 k0 = static_cast<i64>(blockIdx.x) * kRows;  // the block's first key
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const i64 key[2] = {k0 + warp * 16 + (lane >> 2), k0 + warp * 16 + (lane >> 2) + 8};
  const i64 lo[2] = {causal ? key[0] : 0, causal ? key[1] : 0};  // first query reading each key
  const i64 first_key = k0 + warp * 16;                            // the warp's first key
  const float c = scale * kLog2e;

  load_tile<T, D>(ks, kRows, qkv + L.k(b, 0, g), k0, L.T, L.W);
  load_tile<T, D>(vs, kRows, qkv + L.v(b, 0, g), k0, L.T, L.W);
  float dk[kDt][4] = {}, dv[kDt][4] = {};
  for (i64 h = g * R; h < (g + 1) * R; ++h) {
    // Causal: queries before k0 see none of the block's keys; k0 is a multiple of kQueries.
    for (i64 q0 = causal ? k0 : 0; q0 < L.T; q0 += kQueries) {
      __syncthreads();
      load_tile<T, D>(qs, kQueries, qkv + L.q(b, 0, h), q0, L.T, L.W);
      load_tile<T, D>(dos, kQueries, dout + L.o(b, 0, h), q0, L.T, L.H * L.D);
      if (threadIdx.x < kQueries) {
        const i64 i = q0 + threadIdx.x;
        ls[threadIdx.x] = i < L.T ? lse[L.l(b, h, i)] * kLog2e : 0.f;
        dis[threadIdx.x] = i < L.T ? di[L.l(b, h, i)] : 0.f;
      }
      __syncthreads();
      float s[kQueries / 8][4] = {}, dp[kQueries / 8][4] = {};  // Sᵀ, dPᵀ (keys x queries)
      two_score_products<Tuned, T, D, kQueries>(s, dp, ks, vs, qs, dos, S, warp, lane);
      // Masks only where a query of the tile precedes one of the warp's keys
      // (causal) or lies past T (warp-uniform); keys past T are never written.
      const bool masked = !Tuned || (causal && q0 < first_key + 15) || q0 + kQueries > L.T;
      for (int n = 0; n < kQueries / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * tq + (e & 1);
          const i64 i = q0 + col;
          const float p = (!masked || (i >= lo[e >> 1] && i < L.T)) ? exp2f(s[n][e] * c - ls[col]) : 0.f;
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - dis[col]);  // dSᵀ
        }
      for (int kk = 0; kk < kQueries / 16; ++kk) {
        std::uint32_t ap[4], ads[4];
        to_a<T>(ap, s[2 * kk], s[2 * kk + 1]);
        to_a<T>(ads, dp[2 * kk], dp[2 * kk + 1]);
        for (int d2 = 0; d2 < D / 16; ++d2) {
          std::uint32_t b0[2], b1[2];
          load_b_cols(b0, b1, dos, S, kk * 16, d2 * 16, lane);
          mma<T>(dv[2 * d2], ap, b0);
          mma<T>(dv[2 * d2 + 1], ap, b1);
          load_b_cols(b0, b1, qs, S, kk * 16, d2 * 16, lane);
          mma<T>(dk[2 * d2], ads, b0);
          mma<T>(dk[2 * d2 + 1], ads, b1);
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= L.T) continue;
    T* dkp = dqkv + L.k(b, key[r], g) + 2 * tq;
    T* dvp = dqkv + L.v(b, key[r], g) + 2 * tq;
    for (int d = 0; d < kDt; ++d) {
      *reinterpret_cast<std::uint32_t*>(dkp + d * 8) =
          pack<T>(scale * dk[d][2 * r], scale * dk[d][2 * r + 1]);
      *reinterpret_cast<std::uint32_t*>(dvp + d * 8) = pack<T>(dv[d][2 * r], dv[d][2 * r + 1]);
    }
  }
}

// ---- launchers -------------------------------------------------------------

unsigned row_blocks(const AttentionShape& d) {
  return static_cast<unsigned>((d.T + kRows - 1) / kRows);
}

template <class T, int D, bool Tuned>
cudaError_t forward(const void* qkv, void* out, float* lse, const AttentionShape& d, bool causal,
                    cudaStream_t s) {
  const std::size_t smem = sizeof(T) * (3 * kRows * (D + kPad));
  return launch_with_smem(fwd_tc_kernel<T, D, Tuned>, dim3(row_blocks(d), static_cast<unsigned>(d.B * d.H)),
                          kWarps * 32, smem, s, static_cast<const T*>(qkv), static_cast<T*>(out),
                          lse, attention_layout(d), d.scale, causal);
}

template <class T, int D, bool Tuned>
cudaError_t backward(const void* dout, const void* qkv, const float* lse, const float* di,
                     void* dqkv, const AttentionShape& d, bool causal, cudaStream_t s) {
  const AttentionLayout L = attention_layout(d);
  const T* pd = static_cast<const T*>(dout);
  const T* pq = static_cast<const T*>(qkv);
  T* pdq = static_cast<T*>(dqkv);
  const std::size_t tiles = sizeof(T) * (2 * kRows + 2 * kInner<D>) * (D + kPad);
  cudaError_t e = launch_with_smem(dq_tc_kernel<T, D, Tuned>,
                                   dim3(row_blocks(d), static_cast<unsigned>(d.B * d.H)),
                                   kWarps * 32, tiles, s, pd, pq, lse, di, pdq, L, d.scale, causal);
  if (e != cudaSuccess) return e;
  return launch_with_smem(dkv_tc_kernel<T, D, Tuned>, dim3(row_blocks(d), static_cast<unsigned>(d.B * d.G)),
                          kWarps * 32, tiles + sizeof(float) * 2 * kInner<D>, s, pd, pq, lse, di,
                          pdq, L, d.scale, causal);
}

// The storage type and head dim as template arguments.
template <bool Tuned>
cudaError_t forward_tc(const void* qkv, void* out, float* lse, const AttentionShape& d, bool causal, int dtype,
                       cudaStream_t s) {
  if (dtype == 1)
    return d.D == 64 ? forward<__nv_bfloat16, 64, Tuned>(qkv, out, lse, d, causal, s)
                     : forward<__nv_bfloat16, 128, Tuned>(qkv, out, lse, d, causal, s);
  return d.D == 64 ? forward<__half, 64, Tuned>(qkv, out, lse, d, causal, s)
                   : forward<__half, 128, Tuned>(qkv, out, lse, d, causal, s);
}

template <bool Tuned>
cudaError_t backward_tc(const void* dout, const void* qkv, const float* lse, const float* di, void* dqkv,
                        const AttentionShape& d, bool causal, int dtype, cudaStream_t s) {
  if (dtype == 1)
    return d.D == 64 ? backward<__nv_bfloat16, 64, Tuned>(dout, qkv, lse, di, dqkv, d, causal, s)
                     : backward<__nv_bfloat16, 128, Tuned>(dout, qkv, lse, di, dqkv, d, causal, s);
  return d.D == 64 ? backward<__half, 64, Tuned>(dout, qkv, lse, di, dqkv, d, causal, s)
                   : backward<__half, 128, Tuned>(dout, qkv, lse, di, dqkv, d, causal, s);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

bool attention_tc_supported(const AttentionShape& d, int dtype, const AttentionTerms& terms,
                            std::initializer_list<const void*> tensors) {
  if (!terms.plain()) return false;  // a bias or mask: the CUDA-core kernels
  if (d.rows() != d.T) return false;  // a query window: the CUDA-core kernels too
  if (dtype != 1 && dtype != 2) return false;
  if (d.D != 64 && d.D != 128) return false;
  for (const void* p : tensors)
    if (!aligned16(p)) return false;
  return true;
}

cudaError_t attention_forward_tc(const void* qkv, void* out, float* lse, const AttentionShape& d,
                                 bool causal, bool tuned, int dtype, cudaStream_t s) {
  return tuned ? forward_tc<true>(qkv, out, lse, d, causal, dtype, s)
               : forward_tc<false>(qkv, out, lse, d, causal, dtype, s);
}

cudaError_t attention_backward_tc(const void* dout, const void* qkv, const float* lse,
                                  const float* di, void* dqkv, const AttentionShape& d,
                                  bool causal, bool tuned, int dtype, cudaStream_t s) {
  return tuned ? backward_tc<true>(dout, qkv, lse, di, dqkv, d, causal, dtype, s)
               : backward_tc<false>(dout, qkv, lse, di, dqkv, d, causal, dtype, s);
}

}  // namespace meshtrain::cuda::kernels
