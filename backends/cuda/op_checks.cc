#include "backends/cuda/op_checks.h"

namespace meshtrain::cuda {

namespace {
bool is_float(DType t) { return t != DType::i32; }

Status gemm_dtypes(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOp& op) {
  if (!is_float(a.dtype()) || a.dtype() != b.dtype())
    return make_error("a ({}) and b ({}) must share one float dtype", dtype_name(a.dtype()),
                      dtype_name(b.dtype()));
  if (c.dtype() != DType::f32 && c.dtype() != a.dtype())
    return make_error("c ({}) must be f32 or the inputs' dtype {}", dtype_name(c.dtype()),
                      dtype_name(a.dtype()));
  if (op.bias.defined() && op.bias.dtype() != c.dtype())
    return make_error("bias ({}) must have c's dtype {}", dtype_name(op.bias.dtype()),
                      dtype_name(c.dtype()));
  return ok_status();
}
}  // namespace

Result<GemmDims> gemm_dims(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOp& op) {
  MT_TRY(gemm_dtypes(a, b, c, op));
  if (a.shape().rank() == 0 || b.shape().rank() == 0 || c.shape().rank() == 0)
    return make_error("gemm needs tensors with dimensions");
  auto matrix = [](const Tensor& t) {
    const std::int64_t cols = t.shape().back();
    return std::pair{cols == 0 ? 0 : t.numel() / cols, cols};
  };
  const auto [ar, ac] = matrix(a);
  const auto [br, bc] = matrix(b);
  const auto [cr, cc] = matrix(c);
  const std::int64_t m = op.trans_a ? ac : ar, k = op.trans_a ? ar : ac;
  const std::int64_t kb = op.trans_b ? bc : br, n = op.trans_b ? br : bc;
  if (k != kb || cr != m || cc != n)
    return make_error("a {}{} b {}{} c {} do not fit", a.shape().str(), op.trans_a ? "ᵀ" : "",
                      b.shape().str(), op.trans_b ? "ᵀ" : "", c.shape().str());
  if (op.bias.defined() && op.bias.numel() != n)
    return make_error("bias {} should have {} elements", op.bias.shape().str(), n);
  return GemmDims{1, m, n, k};
}

Result<GemmDims> batched_gemm_dims(const Tensor& a, const Tensor& b, const Tensor& c,
                                   const GemmOp& op) {
  MT_TRY(gemm_dtypes(a, b, c, op));
  const Shape &sa = a.shape(), &sb = b.shape(), &sc = c.shape();
  if (sa.rank() != 3 || sb.rank() != 3 || sc.rank() != 3 || sa[0] != sb[0] || sa[0] != sc[0])
    return make_error("a {} b {} c {} must be (L, ·, ·) with one L", sa.str(), sb.str(), sc.str());
  const std::int64_t m = op.trans_a ? sa[2] : sa[1], k = op.trans_a ? sa[1] : sa[2];
  const std::int64_t kb = op.trans_b ? sb[2] : sb[1], n = op.trans_b ? sb[1] : sb[2];
  if (k != kb || sc[1] != m || sc[2] != n)
    return make_error("a {} b {} c {} do not fit", sa.str(), sb.str(), sc.str());
  if (op.bias.defined() && op.bias.numel() != n)
    return make_error("bias {} should have {} elements", op.bias.shape().str(), n);
  return GemmDims{sa[0], m, n, k};
}

Result<AttentionDims> attention_dims(const Tensor& qkv, const AttentionOp& op) {
  const Shape& s = qkv.shape();
  if (op.heads <= 0 || op.kv_heads <= 0 || op.heads % op.kv_heads != 0 || s.rank() != 4 ||
      s[2] != op.heads + 2 * op.kv_heads || s[3] != op.head_dim)
    return make_error("qkv {} must be (B, T, H + 2G, D) with H = {}, G = {}, D = {}, H % G = 0",
                      s.str(), op.heads, op.kv_heads, op.head_dim);
  if (op.head_dim > 128 || op.head_dim % 2 != 0)
    return make_error("head dim {} is not supported: the flash kernel takes even D <= 128",
                      op.head_dim);
  if (!is_float(qkv.dtype()))
    return make_error("qkv is {}; attention takes f32, bf16 or f16", dtype_name(qkv.dtype()));
  // The flash kernels mask causally or not at all and normalise over keys only.
  if (op.sliding_window > 0 || op.sinks.defined())
    return make_error("sliding-window attention and attention sinks are not implemented in the cuda attention "
                      "kernels; train such a model on the cpu backend (or simulate it)");
  AttentionDims d{s[0], s[1], op.heads, op.kv_heads, op.head_dim};
  if (op.query_rows != 0) {
    if (op.query_begin < 0 || op.query_rows < 0 || op.query_begin + op.query_rows > d.T)
      return make_error("query window [{}, {}) is not inside the sequence of {}", op.query_begin,
                        op.query_begin + op.query_rows, d.T);
    if (op.bias.defined() || op.mask.defined())
      return make_error("a query window takes no bias or mask (context parallelism is for decoders)");
    d.q0 = op.query_begin;
    d.Q = op.query_rows;
  }
  return d;
}

Result<std::int64_t> score_terms_check(const AttentionOp& op, const AttentionDims& d,
                                       DType qkv_dtype, bool backward) {
  const std::int64_t TT = d.T * d.T;
  if (op.bias.defined()) {
    if (op.bias.numel() != TT * d.H)
      return make_error("bias {} must be (T, T, H) = ({}, {}, {})", op.bias.shape().str(), d.T, d.T, d.H);
    if (op.bias.dtype() != DType::f32 && op.bias.dtype() != qkv_dtype)
      return make_error("bias is {}; it must be f32 or qkv's {}", dtype_name(op.bias.dtype()),
                        dtype_name(qkv_dtype));
    if (backward) {  // a dbias without a bias is not written (as on the cpu backend)
      if (!op.dbias.defined()) return make_error("a bias needs a dbias output in backward");
      MT_TRY(expect_numel(op.dbias, TT * d.H, "dbias (T, T, H)"));
      MT_TRY(expect_dtype(op.dbias, DType::f32, "dbias"));
    }
  }
  if (!op.mask.defined()) return std::int64_t{1};
  const std::int64_t windows = TT > 0 ? op.mask.numel() / TT : 0;
  if (windows < 1 || op.mask.numel() != windows * TT || d.B % windows != 0)
    return make_error("mask {} must be (W, T, T) with T = {} and W dividing the batch {}",
                      op.mask.shape().str(), d.T, d.B);
  MT_TRY(expect_dtype(op.mask, DType::f32, "mask"));
  return windows;
}

Result<DType> storage_dtype(std::initializer_list<Named> tensors) {
  const Named* first = nullptr;
  for (const Named& t : tensors) {
    if (!is_float(t.tensor->dtype()))
      return make_error("{} {} is {}; it must be fp32, bf16 or fp16", t.name, t.tensor->shape().str(),
                        dtype_name(t.tensor->dtype()));
    if (first == nullptr) {
      first = &t;
    } else if (t.tensor->dtype() != first->tensor->dtype()) {
      return make_error("{} {} is {} but {} {} is {}: they must share one dtype (cast one first)",
                        first->name, first->tensor->shape().str(),
                        dtype_name(first->tensor->dtype()), t.name, t.tensor->shape().str(),
                        dtype_name(t.tensor->dtype()));
    }
  }
  return first ? first->tensor->dtype() : DType::f32;
}

Result<std::int64_t> rows_of(const Tensor& t, std::int64_t cols) {
  if (cols <= 0 || t.numel() % cols != 0)
    return make_error("{} is not a whole number of rows of {}", t.shape().str(), cols);
  return t.numel() / cols;
}

Status expect_numel(const Tensor& t, std::int64_t n, std::string_view what) {
  if (t.numel() != n) return make_error("{} {} should have {} elements", what, t.shape().str(), n);
  return ok_status();
}

Status expect_dtype(const Tensor& t, DType dtype, std::string_view what) {
  if (t.dtype() != dtype)
    return make_error("{} {} is {}, needs {}", what, t.shape().str(), dtype_name(t.dtype()),
                      dtype_name(dtype));
  return ok_status();
}

Status rope_check(const Tensor& x, int heads_total, int rotate_heads) {
  const Shape& s = x.shape();
  if (s.rank() != 4 || s[2] != heads_total || s[3] % 2 != 0 || rotate_heads < 0 ||
      rotate_heads > heads_total)
    return make_error("x {} must be (B, T, {}, D) with D even, rotating {} heads", s.str(),
                      heads_total, rotate_heads);
  return ok_status();
}

Result<RoutingDims> routing_dims(const Tensor& probs, const Tensor& experts) {
  const Shape &p = probs.shape(), &e = experts.shape();
  if (p.rank() != 2 || e.rank() != 2 || p[0] != e[0] || e[1] < 1 || e[1] > p[1] || e[1] > 64)
    return make_error("probabilities {} and experts {} must be (N, E) and (N, K) with 1 <= K <= min(E, 64)", p.str(),
                      e.str());
  MT_TRY(expect_dtype(probs, DType::f32, "probabilities"));
  MT_TRY(expect_dtype(experts, DType::i32, "experts"));
  return RoutingDims{p[0], p[1], e[1]};
}

}  // namespace meshtrain::cuda
