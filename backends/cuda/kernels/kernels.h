// Launchers of the cuda backend's own kernels, callable from host C++ (g++)
// code. This header is free of core/ and fmt so nvcc only sees CUDA. Every
// launcher enqueues on `s` and returns the launch status (cudaGetLastError).
// Pointers are device pointers; shapes are checked by the caller.
// Legend as backends/backend.h. dtype codes follow meshtrain::DType:
// 0 f32, 1 bf16, 2 f16, 3 i32.
//
// Mixed precision: a launcher's `dtype` is the storage type of its pointers
// typed void* (f32, bf16 or f16; every such tensor of one call shares it).
// Pointers typed float* are fp32 whatever `dtype` is: statistics, losses,
// parameter gradients, optimizer state. Math is fp32 (reductions in double)
// for every storage type; results are stored rounded to nearest even.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace meshtrain::cuda::kernels {

using i64 = std::int64_t;

// Fixed partition of whole-tensor reductions: the result's bits depend on the
// element count only, never on the device.
inline constexpr int kReduceBlocks = 256;
// Column reductions (bias and norm parameter gradients) sum rows in chunks of
// at least 32 rows, at most this many chunks.
inline constexpr i64 kMaxRowChunks = 256;
inline i64 row_chunk(i64 rows) {
  const i64 c = (rows + kMaxRowChunks - 1) / kMaxRowChunks;
  return c < 32 ? 32 : c;
}
inline i64 row_chunks(i64 rows) { return (rows + row_chunk(rows) - 1) / row_chunk(rows); }

// ---- elementwise.cu --------------------------------------------------------
cudaError_t fill(void* x, int dtype, i64 n, float value, cudaStream_t s);
cudaError_t cast(const void* src, int src_dtype, void* dst, int dst_dtype, i64 n, cudaStream_t s);
cudaError_t add(const void* a, const void* b, void* out, int dtype, i64 n, cudaStream_t s);
cudaError_t scale(void* x, int dtype, i64 n, float alpha, cudaStream_t s);
cudaError_t axpy(float alpha, const void* x, void* y, int dtype, i64 n, cudaStream_t s);
// c (m, n) = beta · c + bias: a GEMM with k = 0 (bias may be null).
cudaError_t gemm_k0(float* c, const float* bias, i64 m, i64 n, float beta, cudaStream_t s);
cudaError_t gelu_forward(const void* x, void* out, int dtype, i64 n, cudaStream_t s);
cudaError_t gelu_backward(const void* dout, const void* x, void* dx, int dtype, i64 n,
                          cudaStream_t s);
cudaError_t swiglu_forward(const void* x, void* out, int dtype, i64 N, i64 F, cudaStream_t s);
cudaError_t swiglu_backward(const void* dout, const void* x, void* dx, int dtype, i64 N, i64 F,
                            cudaStream_t s);
// x and out may be the same tensor (in place).
cudaError_t dropout(const void* x, void* out, int dtype, i64 n, float p, std::uint64_t seed,
                    std::uint64_t offset, cudaStream_t s);
cudaError_t clip_coefficient(const float* sumsq, float max_norm, float* coef, cudaStream_t s);

// ---- fp8_cast.cu -----------------------------------------------------------
// y = x on the FP8 grid of `scale` (E4M3, or E5M2), in x's storage type; *amax = max(*amax, max |x|).
// With `current`, the scale is current scaling's of *amax instead, and *amax is only read.
cudaError_t fp8_cast(const void* x, void* y, int dtype, i64 n, float scale, bool e5m2, bool current, float* amax,
                     cudaStream_t s);
// *amax = max(*amax, max |x|).
cudaError_t amax(const void* x, int dtype, i64 n, float* amax, cudaStream_t s);

// ---- multi_tensor.cu: whole-tensor sums and AdamW, one tensor or many ------
// A multi-tensor launch takes its table of tensors as a kernel parameter (up
// to kMaxForeach tensors, ~12 KiB: CUDA 12.1+ allows 32 KiB of parameters),
// so nothing is uploaded and no host buffer must outlive the launch; callers
// split longer lists into launches of kMaxForeach.
inline constexpr int kMaxForeach = 256;

// One tensor of a sum: x of storage `dtype`, n elements.
struct ReduceInput {
  const void* x;
  int dtype;
  i64 n;
};
// Tensor k is summed by min(kReduceBlocks, ceil(n / 256)) blocks (at least
// one), each over a fixed grid-stride set of its elements in double, then
// those partials by one block in a fixed tree: the bits depend on n only.
i64 reduce_blocks(i64 n);
// out (1) = scale · Σ x (or Σ x² when squares) of xs[0], then out +=
// scale · Σ of xs[1], xs[2], ... in order, rounding out to fp32 after each
// tensor: exactly the per-tensor reduce of each one in turn. accumulate: the
// first is added to out too. count <= kMaxForeach; scratch holds
// Σ reduce_blocks(n) doubles. Two launches whatever count is.
cudaError_t reduce_sum(const ReduceInput* xs, int count, bool squares, float scale, bool accumulate,
                       float* out, double* scratch, cudaStream_t s);

// c1 = 1/(1-β1^t), c2 = 1/(1-β2^t), decay = 1 - lr·wd, computed by the host
// in double as the cpu backend does. coef may be null (no clipping). The
// update is the cpu backend's, operation for operation and without FMA
// contraction (explicitly rounded intrinsics), so it gives its bits.
struct AdamWArgs {
  float lr, beta1, beta2, eps, c1, c2, decay;
};
cudaError_t adamw(float* param, const float* grad, float* m, float* v, const float* coef, i64 n,
                  const AdamWArgs& a, cudaStream_t s);
// One tensor of a multi-tensor AdamW: decay replaces AdamWArgs::decay.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  i64 n;
  float decay;
};
// adamw of each tensor (count <= kMaxForeach) in one launch, the same bits.
cudaError_t foreach_adamw(const AdamWTensor* ts, int count, const float* coef, const AdamWArgs& a,
                          cudaStream_t s);

// ---- normal_init.cu ----------------------------------------------------------
// Backend::init_normal on the device: x (n elements of storage dtype) viewed
// as (n / cols, cols); columns [col, col + width) of row r get
// stddev · normal_at(key, counter + r·row_stride + j) rounded to fp32, then
// to dtype. Elements no run covers are zeroed when zero_rest, else kept.
// runs are sorted and disjoint (checked by the caller), count <= kMaxNormalRuns.
struct NormalRun {
  i64 col, width;
  std::uint64_t counter;
};
inline constexpr int kMaxNormalRuns = 64;
struct NormalInitArgs {
  std::uint64_t key;
  double stddev;
  i64 cols;
  std::uint64_t row_stride;
  int nruns;
  bool zero_rest;
  NormalRun runs[kMaxNormalRuns];
};
cudaError_t init_normal(void* x, int dtype, i64 n, const NormalInitArgs& a, cudaStream_t s);

// ---- cross_entropy.cu ------------------------------------------------------
// logits and dlogits of storage `dtype`; the row statistics and losses fp32.
cudaError_t ce_max(const void* logits, int dtype, float* row_max, i64 N, i64 V, cudaStream_t s);
cudaError_t ce_partials(const void* logits, int dtype, const std::int32_t* targets,
                        const float* row_max, i64 vocab_offset, float* sumexp,
                        float* target_logit, i64 N, i64 V, cudaStream_t s);
cudaError_t ce_loss(const float* row_max, const float* sumexp, const float* target_logit,
                    float* losses, i64 N, cudaStream_t s);
cudaError_t ce_backward(const void* logits, int dtype, const std::int32_t* targets,
                        const float* row_max, const float* sumexp, i64 vocab_offset, float dloss,
                        void* dlogits, i64 N, i64 V, cudaStream_t s);
// correct (1) = number of rows r with target_logit[r] >= row_max[r], plus
// correct's old value when accumulate. An integer count: exact in any order.
cudaError_t ce_accuracy(const float* row_max, const float* target_logit, float* correct, i64 N,
                        bool accumulate, cudaStream_t s);

// ---- norm.cu ---------------------------------------------------------------
// x, w, b, out, dout, dx of storage `dtype`; mean, rstd and the parameter
// gradients dw, db fp32 (the engine's layout under mixed precision).
cudaError_t layernorm_forward(const void* x, const void* w, const void* b, void* out, int dtype,
                              float* mean, float* rstd, i64 N, i64 C, float eps, cudaStream_t s);
// dx overwritten; dw, db += (scratch: row_chunks(N) · 2C doubles).
cudaError_t layernorm_backward(const void* dout, const void* x, const void* w, void* dx,
                               int dtype, const float* mean, const float* rstd, float* dw,
                               float* db, i64 N, i64 C, double* scratch, cudaStream_t s);
cudaError_t rmsnorm_forward(const void* x, const void* w, void* out, int dtype, float* rstd, i64 N,
                            i64 C, float eps, cudaStream_t s);
// scratch: row_chunks(N) · C doubles.
cudaError_t rmsnorm_backward(const void* dout, const void* x, const void* w, void* dx, int dtype,
                             const float* rstd, float* dw, i64 N, i64 C, double* scratch,
                             cudaStream_t s);
// db (n) fp32 += column sums of dy (m, n) of storage `dtype`; scratch:
// row_chunks(m) · n doubles.
cudaError_t bias_backward(const void* dy, int dtype, float* db, i64 m, i64 n, double* scratch,
                          cudaStream_t s);

// ---- embedding.cu ----------------------------------------------------------
// out (N, X) row i = src (M, X) row index[i] - offset when that is in [0, M),
// else a zero row: gather_rows (offset 0) and the embedding lookup (offset
// the vocabulary shard's first id). src and out of storage `dtype`; the copy
// moves bytes, so the result is exact.
cudaError_t gather_rows(const void* src, const std::int32_t* index, void* out, int dtype, i64 N,
                        i64 X, i64 M, i64 offset, cudaStream_t s);
// dtable (V, C) += Σ over tokens n whose id is in [vocab_offset, vocab_offset
// + V) of dout row n; rows no token uses are left as they are. dout of
// storage `dtype`, dtable fp32 (a parameter gradient). Each row sums its
// tokens in token order, in double: deterministic. scratch: at least
// embedding_backward_scratch(N, V) bytes, 256-byte aligned.
std::size_t embedding_backward_scratch(i64 N, i64 V);
cudaError_t embedding_backward(const void* dout, int dtype, const std::int32_t* ids, float* dtable,
                               i64 N, i64 C, i64 V, i64 vocab_offset, void* scratch,
                               std::size_t scratch_bytes, cudaStream_t s);

// ---- moe.cu ----------------------------------------------------------------
// The mixture-of-experts ops of backends/backend.h. The router runs one
// thread per token in double, as the cpu backend does (its top-k takes the
// lower expert on ties); K is at most kMaxTopK.
inline constexpr i64 kMaxTopK = 64;
cudaError_t moe_route(const float* logits, float* probs, float* lse, float* weights, std::int32_t* experts, i64 N,
                      i64 E, i64 K, bool renormalize, cudaStream_t s);
cudaError_t moe_route_backward(const float* dweights, const float* probs, const float* lse,
                               const std::int32_t* experts, const float* prob_grad, float z_scale, bool renormalize,
                               float* dlogits, i64 N, i64 E, i64 K, cudaStream_t s);
// rows (M, C), out (N, C), drows and dout of storage `dtype`; weights and
// dweights (N, K) fp32. One block per token sums its slots in slot order.
cudaError_t moe_combine(const void* rows, const std::int32_t* index, const float* weights, void* out, int dtype,
                        i64 N, i64 K, i64 C, cudaStream_t s);
cudaError_t moe_combine_backward(const void* dout, const void* rows, const std::int32_t* index,
                                 const float* weights, void* drows, float* dweights, int dtype, i64 N, i64 K, i64 C,
                                 i64 M, cudaStream_t s);

// ---- compression.cu ---------------------------------------------------------
// Backend::sign_compress / sign_decompress: x and error (C, k) f32 (error
// null: no error feedback), packets (C, 1 + ceil(k/32)) i32.
cudaError_t sign_compress(const float* x, float* error, std::int32_t* packets, i64 C, i64 k, cudaStream_t s);
cudaError_t sign_decompress(const std::int32_t* packets, float* out, i64 C, i64 k, cudaStream_t s);

// ---- rope.cu ---------------------------------------------------------------
// x of storage `dtype`, rotated in fp32, token t at position first_position + t;
// scratch: 2 · T · D/2 floats (the cos and sin table).
cudaError_t rope(void* x, int dtype, i64 B, i64 T, i64 heads_total, i64 rotate_heads, i64 D,
                 double theta, bool inverse, i64 first_position, float* scratch, cudaStream_t s);

// ---- attention.cu ----------------------------------------------------------
inline constexpr int kMaxHeadDim = 128;
struct AttentionShape {
  i64 B, T, H, G, D;
  float scale;
  // The query window: only query rows [q0, q0 + Q) of T are computed, against
  // every key (causal: row t reads keys 0..t); out, lse and dout hold the
  // window's Q rows, and dqkv's query rows outside it are zero. Q 0: all T.
  i64 q0 = 0, Q = 0;
  i64 rows() const { return Q > 0 ? Q : T; }
};
// What AttentionOp adds to the scores s = scale · q kᵀ (backends/backend.h),
// as the kernels read it, and where backward leaves the score gradients.
struct AttentionTerms {
  bool causal = true;
  const float* bias = nullptr;  // (H, T, T) f32, heads first (attention_bias_heads_first)
  const float* mask = nullptr;  // (W, T, T) f32: batch entry b adds window b mod W
  i64 windows = 1;              // W
  float* dscores = nullptr;     // backward: (B, H, T, T) f32 receives every dS, or null
  // The tensor-core path's tuned kernels (attention_tc.cu: ldmatrix loads,
  // Q kept in registers, masks only where a tile needs them, occupancy held
  // by launch bounds) instead of the reference ones. Same arithmetic, so the
  // same bits by construction; off until a GPU run has verified exactly that
  // (CudaOptions::tuned_attention).
  bool tuned_tc = false;
  // Nothing beyond the causal flag: the tensor-core kernels' case.
  bool plain() const { return bias == nullptr && mask == nullptr && dscores == nullptr; }
};
// out (H, T, T) f32 = bias (T, T, H) of dtype code `dtype` (f32 or 16-bit),
// heads first: the layout in which a query row's keys are consecutive.
cudaError_t attention_bias_heads_first(const void* bias, int dtype, float* out, i64 T, i64 H,
                                       cudaStream_t s);
// qkv, out (and dout, dqkv) of storage `dtype` (f32, bf16 or f16); lse f32.
cudaError_t attention_forward(const void* qkv, void* out, float* lse, const AttentionShape& d,
                              const AttentionTerms& terms, int dtype, cudaStream_t s);
// scratch: B · H · rows() floats (the row dot products dO · O). With
// terms.dscores, every dS (unscaled: the gradient of the summed score) is
// stored there; with terms.causal the entries above the diagonal may be left
// unwritten (attention_dbias does not read them).
cudaError_t attention_backward(const void* dout, const void* qkv, const void* out,
                               const float* lse, void* dqkv, const AttentionShape& d,
                               const AttentionTerms& terms, int dtype, float* scratch,
                               cudaStream_t s);
// dbias (T, T, H) f32 = Σ_b dscores (B, H, T, T), summed in ascending b in
// double (zero above the diagonal when causal): the same bits every run.
cudaError_t attention_dbias(const float* dscores, float* dbias, i64 B, i64 H, i64 T, bool causal,
                            cudaStream_t s);

// ---- attention_tc.cu -------------------------------------------------------
// The tensor-core path that attention_forward and attention_backward take by
// themselves when attention_tc_supported (16-bit storage, D of 64 or 128,
// every tensor 16-byte aligned, causal or not, no bias, mask or query window). Same outputs
// and lse layout; di (B, H, T) are the row dot products dO · O, computed before.
bool attention_tc_supported(const AttentionShape& d, int dtype, const AttentionTerms& terms,
                            std::initializer_list<const void*> tensors);
cudaError_t attention_forward_tc(const void* qkv, void* out, float* lse, const AttentionShape& d,
                                 bool causal, bool tuned, int dtype, cudaStream_t s);
cudaError_t attention_backward_tc(const void* dout, const void* qkv, const float* lse,
                                  const float* di, void* dqkv, const AttentionShape& d,
                                  bool causal, bool tuned, int dtype, cudaStream_t s);

}  // namespace meshtrain::cuda::kernels
