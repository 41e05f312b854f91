// Shape and dtype rules of the cuda backend's ops, as pure functions: the
// backend aborts on their errors (misuse, see backends/backend.h), the tests
// check them without a device.
#pragma once

#include <cstdint>

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
};
// qkv (B, T, H + 2G, D) with H % G == 0, D even and at most 128 (the flash
// kernel's register tile), dtype f32 or bf16.
Result<AttentionDims> attention_dims(const Tensor& qkv, const AttentionOp& op);

// Rows of a tensor documented as (N, cols).
Result<std::int64_t> rows_of(const Tensor& t, std::int64_t cols);
Status expect_numel(const Tensor& t, std::int64_t n, std::string_view what);
Status expect_dtype(const Tensor& t, DType dtype, std::string_view what);
// rope: x (B, T, heads_total, D), D even, 0 <= rotate_heads <= heads_total.
Status rope_check(const Tensor& x, int heads_total, int rotate_heads);

}  // namespace meshtrain::cuda
