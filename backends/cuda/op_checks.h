// Shape and dtype rules of the cuda backend's ops, as pure functions: the
// backend aborts on their errors (misuse, see backends/backend.h), the tests
// check them without a device.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain::cuda {

struct GemmDims {
  std::int64_t batch, m, n, k;
};

// gemm: a, b, c viewed as matrices over their last dimension (backend.h).
// Inputs a and b share a float dtype; c is f32 or that dtype; a bias has c's
// dtype and n elements.
Result<GemmDims> gemm_dims(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOp& op);
// batched_gemm: a (L, m, k), b (L, k, n), c (L, m, n) (transposes per op).
Result<GemmDims> batched_gemm_dims(const Tensor& a, const Tensor& b, const Tensor& c,
                                   const GemmOp& op);

struct AttentionDims {
  std::int64_t B, T, H, G, D;
  // The query window (AttentionOp::query_begin/query_rows): rows [q0, q0 + Q)
  // of T; Q 0: all T.
  std::int64_t q0 = 0, Q = 0;
  std::int64_t rows() const { return Q > 0 ? Q : T; }
};
// qkv (B, T, H + 2G, D) with H % G == 0, D even and at most 128 (the flash
// kernel's register tile), dtype f32, bf16 or f16; a query window inside the
// sequence, without a bias or mask (as the cpu backend takes it).
Result<AttentionDims> attention_dims(const Tensor& qkv, const AttentionOp& op);
// The score terms of `op` (backend.h's AttentionOp) for qkv of dims d and
// dtype qkv_dtype: a bias of T·T·H elements, f32 or qkv_dtype; a mask f32 of
// W·T·T elements with W >= 1 dividing B; in backward a bias needs a dbias f32
// of T·T·H elements (a dbias without a bias is ignored). Gives W (1 without
// a mask).
Result<std::int64_t> score_terms_check(const AttentionOp& op, const AttentionDims& d,
                                       DType qkv_dtype, bool backward);

// Mixed precision. An op's activation-like tensors (x, out, dout, dx, logits,
// a norm's weight and bias, an embedding table) share one storage dtype: f32,
// bf16 or f16, computed in fp32. Statistics (mean, rstd, lse, row max,
// sumexp, losses), parameter gradients and optimizer state stay f32 and are
// checked by the backend itself. `storage_dtype` gives the shared dtype of
// `tensors` (all defined), or an error naming the first pair that differ or
// the first tensor that is not a float.
struct Named {
  std::string_view name;
  const Tensor* tensor;
};
Result<DType> storage_dtype(std::initializer_list<Named> tensors);
// The dtype code of kernels/kernels.h (0 f32, 1 bf16, 2 f16, 3 i32).
inline int kernel_dtype(DType t) { return static_cast<int>(t); }
static_assert(static_cast<int>(DType::f32) == 0 && static_cast<int>(DType::bf16) == 1 &&
                  static_cast<int>(DType::f16) == 2 && static_cast<int>(DType::i32) == 3,
              "kernels/kernels.h dtype codes");

// Rows of a tensor documented as (N, cols).
Result<std::int64_t> rows_of(const Tensor& t, std::int64_t cols);
Status expect_numel(const Tensor& t, std::int64_t n, std::string_view what);
Status expect_dtype(const Tensor& t, DType dtype, std::string_view what);
// Mixture of experts: probabilities (or logits) (N, E) f32 and experts
// (N, K) i32 with 1 <= K <= min(E, 64) (the router kernels' slot limit).
struct RoutingDims {
  std::int64_t N, E, K;
};
Result<RoutingDims> routing_dims(const Tensor& probs, const Tensor& experts);
// rope: x (B, T, heads_total, D), D even, 0 <= rotate_heads <= heads_total.
Status rope_check(const Tensor& x, int heads_total, int rotate_heads);

}  // namespace meshtrain::cuda
