// CpuBackend compute ops: shape checks, then the float instantiation of the
// kernels in kernels/. Legend as backends/backend.h.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/cross_entropy.h"
#include "backends/cpu/kernels/elementwise.h"
#include "backends/cpu/kernels/embedding.h"
#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/moe.h"
#include "backends/cpu/kernels/norm.h"
#include "backends/cpu/kernels/normal.h"
#include "backends/normal_init_check.h"
#include "backends/cpu/kernels/optimizer.h"
#include "backends/cpu/kernels/rope.h"
#include "backends/cpu/kernels/sign_compression.h"
#include "backends/cpu/misuse.h"

namespace meshtrain {

using cpu::misuse;

namespace {

struct Matrix {
  std::int64_t rows, cols;
};

// A tensor where (rows, X) is documented, X its last dimension.
Matrix as_matrix(const Tensor& t, std::string_view op) {
  if (t.shape().rank() == 0) misuse("{}: tensor without dimensions", op);
  const std::int64_t cols = t.shape().back();
  return Matrix{cols == 0 ? 0 : t.numel() / cols, cols};
}

// Rows of a tensor documented as (N, cols).
std::int64_t rows_of(const Tensor& t, std::int64_t cols, std::string_view op) {
  if (cols <= 0 || t.numel() % cols != 0)
    misuse("{}: {} is not a whole number of rows of {}", op, t.shape().str(), cols);
  return t.numel() / cols;
}

void expect_numel(const Tensor& t, std::int64_t n, std::string_view op, std::string_view what) {
  if (t.numel() != n) misuse("{}: {} {} should have {} elements", op, what, t.shape().str(), n);
}

}  // namespace

// ---- dense -----------------------------------------------------------------------

void CpuBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  const float* pa = f32(a, "gemm");
  const float* pb = f32(b, "gemm");
  float* pc = f32(c, "gemm");
  const float* bias = op.bias.defined() ? f32(op.bias, "gemm bias") : nullptr;
  const Matrix ma = as_matrix(a, "gemm"), mb = as_matrix(b, "gemm"), mc = as_matrix(c, "gemm");
  const std::int64_t m = op.trans_a ? ma.cols : ma.rows, k = op.trans_a ? ma.rows : ma.cols;
  const std::int64_t kb = op.trans_b ? mb.cols : mb.rows, n = op.trans_b ? mb.rows : mb.cols;
  if (k != kb || mc.rows != m || mc.cols != n)
    misuse("gemm: a {}{} b {}{} c {} do not fit", a.shape().str(), op.trans_a ? "ᵀ" : "",
           b.shape().str(), op.trans_b ? "ᵀ" : "", c.shape().str());
  if (bias) expect_numel(op.bias, n, "gemm", "bias");
  if (error_) return;
  const auto threads = on_threads();
  cpu::gemm(op.trans_a, op.trans_b, m, n, k, op.alpha, pa, pb, op.beta, pc, bias);
}

void CpuBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  const float* pa = f32(a, "batched_gemm");
  const float* pb = f32(b, "batched_gemm");
  float* pc = f32(c, "batched_gemm");
  const float* bias = op.bias.defined() ? f32(op.bias, "batched_gemm bias") : nullptr;
  const Shape &sa = a.shape(), &sb = b.shape(), &sc = c.shape();
  if (sa.rank() != 3 || sb.rank() != 3 || sc.rank() != 3 || sa[0] != sb[0] || sa[0] != sc[0])
    misuse("batched_gemm: a {} b {} c {} must be (L, ·, ·) with one L", sa.str(), sb.str(),
           sc.str());
  const std::int64_t m = op.trans_a ? sa[2] : sa[1], k = op.trans_a ? sa[1] : sa[2];
  const std::int64_t kb = op.trans_b ? sb[2] : sb[1], n = op.trans_b ? sb[1] : sb[2];
  if (k != kb || sc[1] != m || sc[2] != n)
    misuse("batched_gemm: a {} b {} c {} do not fit", sa.str(), sb.str(), sc.str());
  if (bias) expect_numel(op.bias, n, "batched_gemm", "bias");
  if (error_) return;
  const auto threads = on_threads();
  const std::int64_t L = sa[0];
  cpu::for_chunks(L, std::max<std::int64_t>(1, cpu::kGrain / std::max<std::int64_t>(m * n * k, 1)),
                  [&](std::int64_t begin, std::int64_t end) {
                    for (std::int64_t l = begin; l < end; ++l)
                      cpu::gemm(op.trans_a, op.trans_b, m, n, k, op.alpha, pa + l * m * k,
                                pb + l * k * n, op.beta, pc + l * m * n, bias);
                  });
}

void CpuBackend::bias_backward(const Tensor& dy, Tensor& db) {
  const float* pdy = f32(dy, "bias_backward");
  float* pdb = f32(db, "bias_backward");
  const std::int64_t n = db.numel(), m = rows_of(dy, n, "bias_backward");
  if (error_) return;
  const auto threads = on_threads();
  cpu::bias_backward(m, n, pdy, pdb);
}

// ---- embedding ---------------------------------------------------------------------

void CpuBackend::embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                   std::int64_t vocab_offset) {
  const float* pt = f32(table, "embedding_forward");
  const std::int32_t* pi = i32(ids, "embedding_forward");
  float* po = f32(out, "embedding_forward");
  const Matrix mt = as_matrix(table, "embedding_forward");
  expect_numel(out, ids.numel() * mt.cols, "embedding_forward", "out");
  if (error_) return;
  const auto threads = on_threads();
  cpu::embedding_forward(ids.numel(), mt.cols, mt.rows, vocab_offset, pt, pi, po);
}

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                    std::int64_t vocab_offset) {
  const float* pd = f32(dout, "embedding_backward");
  const std::int32_t* pi = i32(ids, "embedding_backward");
  float* pt = f32(dtable, "embedding_backward");
  const Matrix mt = as_matrix(dtable, "embedding_backward");
  expect_numel(dout, ids.numel() * mt.cols, "embedding_backward", "dout");
  if (error_) return;
  const auto threads = on_threads();
  cpu::embedding_backward(ids.numel(), mt.cols, mt.rows, vocab_offset, pd, pi, pt);
}

// ---- normalisation -------------------------------------------------------------------

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   Tensor& out, Tensor& mean, Tensor& rstd, float eps) {
  constexpr std::string_view op = "layernorm_forward";
  const std::int64_t C = weight.numel(), N = rows_of(x, C, op);
  expect_numel(bias, C, op, "bias");
  expect_numel(out, N * C, op, "out");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  const float *px = f32(x, op), *pw = f32(weight, op), *pb = f32(bias, op);
  float *po = f32(out, op), *pm = f32(mean, op), *pr = f32(rstd, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::layernorm_forward(N, C, px, pw, pb, po, pm, pr, eps);
}

void CpuBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias) {
  constexpr std::string_view op = "layernorm_backward";
  const std::int64_t C = weight.numel(), N = rows_of(x, C, op);
  expect_numel(dout, N * C, op, "dout");
  expect_numel(dx, N * C, op, "dx");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  expect_numel(dweight, C, op, "dweight");
  expect_numel(dbias, C, op, "dbias");
  const float *pd = f32(dout, op), *px = f32(x, op), *pw = f32(weight, op), *pm = f32(mean, op),
              *pr = f32(rstd, op);
  float *pdx = f32(dx, op), *pdw = f32(dweight, op), *pdb = f32(dbias, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::layernorm_backward(N, C, pd, px, pw, pm, pr, pdx, pdw, pdb);
}

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                                 float eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  const std::int64_t C = weight.numel(), N = rows_of(x, C, op);
  expect_numel(out, N * C, op, "out");
  expect_numel(rstd, N, op, "rstd");
  const float *px = f32(x, op), *pw = f32(weight, op);
  float *po = f32(out, op), *pr = f32(rstd, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::rmsnorm_forward(N, C, px, pw, po, pr, eps);
}

void CpuBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  constexpr std::string_view op = "rmsnorm_backward";
  const std::int64_t C = weight.numel(), N = rows_of(x, C, op);
  expect_numel(dout, N * C, op, "dout");
  expect_numel(dx, N * C, op, "dx");
  expect_numel(rstd, N, op, "rstd");
  expect_numel(dweight, C, op, "dweight");
  const float *pd = f32(dout, op), *px = f32(x, op), *pw = f32(weight, op), *pr = f32(rstd, op);
  float *pdx = f32(dx, op), *pdw = f32(dweight, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::rmsnorm_backward(N, C, pd, px, pw, pr, pdx, pdw);
}

// ---- activations -----------------------------------------------------------------------

void CpuBackend::gelu_forward(const Tensor& x, Tensor& out) {
  const float* px = f32(x, "gelu_forward");
  float* po = f32(out, "gelu_forward");
  expect_numel(out, x.numel(), "gelu_forward", "out");
  if (error_) return;
  const auto threads = on_threads();
  cpu::gelu_forward(x.numel(), px, po);
}

void CpuBackend::gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  const float *pd = f32(dout, "gelu_backward"), *px = f32(x, "gelu_backward");
  float* pdx = f32(dx, "gelu_backward");
  expect_numel(dout, x.numel(), "gelu_backward", "dout");
  expect_numel(dx, x.numel(), "gelu_backward", "dx");
  if (error_) return;
  const auto threads = on_threads();
  cpu::gelu_backward(x.numel(), pd, px, pdx);
}

void CpuBackend::swiglu_forward(const Tensor& x, Tensor& out) {
  const float* px = f32(x, "swiglu_forward");
  float* po = f32(out, "swiglu_forward");
  const Matrix mx = as_matrix(x, "swiglu_forward");
  if (mx.cols % 2 != 0) misuse("swiglu_forward: x {} must be (N, 2F)", x.shape().str());
  expect_numel(out, x.numel() / 2, "swiglu_forward", "out");
  if (error_) return;
  const auto threads = on_threads();
  cpu::swiglu_forward(mx.rows, mx.cols / 2, px, po);
}

void CpuBackend::swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  const float *pd = f32(dout, "swiglu_backward"), *px = f32(x, "swiglu_backward");
  float* pdx = f32(dx, "swiglu_backward");
  const Matrix mx = as_matrix(x, "swiglu_backward");
  if (mx.cols % 2 != 0) misuse("swiglu_backward: x {} must be (N, 2F)", x.shape().str());
  expect_numel(dout, x.numel() / 2, "swiglu_backward", "dout");
  expect_numel(dx, x.numel(), "swiglu_backward", "dx");
  if (error_) return;
  const auto threads = on_threads();
  cpu::swiglu_backward(mx.rows, mx.cols / 2, pd, px, pdx);
}

namespace {
void expect_probability(float p, std::string_view op) {
  if (!(p >= 0.f && p <= 1.f)) misuse("{}: p = {} is not a probability", op, p);
}
}  // namespace

void CpuBackend::dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) {
  const float* px = f32(x, "dropout_forward");
  float* po = f32(out, "dropout_forward");
  expect_numel(out, x.numel(), "dropout_forward", "out");
  expect_probability(op.p, "dropout_forward");
  if (error_) return;
  const auto threads = on_threads();
  cpu::dropout(x.numel(), px, po, op.p, op.seed, op.offset);
}

void CpuBackend::dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) {
  const float* pd = f32(dout, "dropout_backward");
  float* pdx = f32(dx, "dropout_backward");
  expect_numel(dx, dout.numel(), "dropout_backward", "dx");
  expect_probability(op.p, "dropout_backward");
  if (error_) return;
  const auto threads = on_threads();
  cpu::dropout(dout.numel(), pd, pdx, op.p, op.seed, op.offset);
}

// ---- index maps ------------------------------------------------------------------------

void CpuBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  constexpr std::string_view op = "gather_rows";
  const float* ps = f32(src, op);
  const std::int32_t* pi = i32(index, op);
  float* po = f32(out, op);
  const Matrix ms = as_matrix(src, op);
  expect_numel(out, index.numel() * ms.cols, op, "out");
  if (error_) return;
  const auto threads = on_threads();
  // The embedding lookup is this gather: rows outside [0, M) (the negative padding entries) read zeros.
  cpu::embedding_forward(index.numel(), ms.cols, ms.rows, 0, ps, pi, po);
}

// ---- mixture of experts ----------------------------------------------------------------

namespace {
// (N, E) logits or probabilities and (N, K) experts of one routing.
struct Routing {
  std::int64_t N, E, K;
};
Routing routing_of(const Tensor& probs, const Tensor& experts, std::string_view op) {
  const Shape &p = probs.shape(), &e = experts.shape();
  if (p.rank() != 2 || e.rank() != 2 || p[0] != e[0] || e[1] < 1 || e[1] > p[1])
    misuse("{}: probabilities {} and experts {} must be (N, E) and (N, K) with 1 <= K <= E", op, p.str(), e.str());
  return {p[0], p[1], e[1]};
}
}  // namespace

void CpuBackend::moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                           Tensor& experts) {
  constexpr std::string_view op = "moe_route";
  const Routing r = routing_of(logits, experts, op);
  expect_numel(probs, r.N * r.E, op, "probs");
  expect_numel(lse, r.N, op, "lse");
  expect_numel(weights, r.N * r.K, op, "weights");
  const float* pl = f32(logits, op);
  float *pp = f32(probs, op), *plse = f32(lse, op), *pw = f32(weights, op);
  auto* pe = const_cast<std::int32_t*>(i32(experts, op));
  if (error_) return;
  cpu::moe_route(r.N, r.E, r.K, renormalize, pl, pp, plse, pw, pe);
}

void CpuBackend::moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                                    const Tensor& experts, const Tensor& prob_grad, float z_scale, bool renormalize,
                                    Tensor& dlogits) {
  constexpr std::string_view op = "moe_route_backward";
  const Routing r = routing_of(probs, experts, op);
  expect_numel(dweights, r.N * r.K, op, "dweights");
  expect_numel(lse, r.N, op, "lse");
  expect_numel(prob_grad, r.E, op, "prob_grad");
  expect_numel(dlogits, r.N * r.E, op, "dlogits");
  const float *pdw = f32(dweights, op), *pp = f32(probs, op), *plse = f32(lse, op), *pg = f32(prob_grad, op);
  const std::int32_t* pe = i32(experts, op);
  float* pd = f32(dlogits, op);
  if (error_) return;
  cpu::moe_route_backward(r.N, r.E, r.K, renormalize, pdw, pp, plse, pe, pg, z_scale, pd);
}

void CpuBackend::moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) {
  constexpr std::string_view op = "moe_combine";
  const Matrix mr = as_matrix(rows, op), mi = as_matrix(index, op);
  expect_numel(weights, index.numel(), op, "weights");
  expect_numel(out, mi.rows * mr.cols, op, "out");
  const float *pr = f32(rows, op), *pw = f32(weights, op);
  const std::int32_t* pi = i32(index, op);
  float* po = f32(out, op);
  if (error_) return;
  cpu::moe_combine(mi.rows, mi.cols, mr.cols, pr, pi, pw, po);
}

void CpuBackend::moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index,
                                      const Tensor& weights, Tensor& drows, Tensor& dweights) {
  constexpr std::string_view op = "moe_combine_backward";
  const Matrix mr = as_matrix(rows, op), mi = as_matrix(index, op);
  expect_numel(weights, index.numel(), op, "weights");
  expect_numel(dweights, index.numel(), op, "dweights");
  expect_numel(dout, mi.rows * mr.cols, op, "dout");
  expect_numel(drows, rows.numel(), op, "drows");
  const float *pd = f32(dout, op), *pr = f32(rows, op), *pw = f32(weights, op);
  const std::int32_t* pi = i32(index, op);
  float *pdr = f32(drows, op), *pdw = f32(dweights, op);
  if (error_) return;
  cpu::moe_combine_backward(mi.rows, mi.cols, mr.cols, mr.rows, pd, pr, pi, pw, pdr, pdw);
}

// ---- attention -------------------------------------------------------------------------

void CpuBackend::rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
                      std::int64_t first_position) {
  float* px = f32(x, "rope");
  const Shape& s = x.shape();
  if (s.rank() != 4 || s[2] != heads_total || s[3] % 2 != 0 || rotate_heads < 0 ||
      rotate_heads > heads_total)
    misuse("rope: x {} must be (B, T, {}, D) with D even, rotating {} heads", s.str(), heads_total,
           rotate_heads);
  if (error_) return;
  const auto threads = on_threads();
  cpu::rope(s[0], s[1], heads_total, rotate_heads, s[3], theta, inverse, first_position, px);
}

namespace {
cpu::AttentionDims attention_dims(const Tensor& qkv, const AttentionOp& op, std::string_view name) {
  const Shape& s = qkv.shape();
  if (op.heads <= 0 || op.kv_heads <= 0 || op.heads % op.kv_heads != 0 || s.rank() != 4 ||
      s[2] != op.heads + 2 * op.kv_heads || s[3] != op.head_dim)
    misuse("{}: qkv {} must be (B, T, H + 2G, D) with H = {}, G = {}, D = {}, H % G = 0", name,
           s.str(), op.heads, op.kv_heads, op.head_dim);
  cpu::AttentionDims d{s[0], s[1], op.heads, op.kv_heads, op.head_dim};
  if (op.query_rows != 0) {
    if (op.query_begin < 0 || op.query_rows < 0 || op.query_begin + op.query_rows > d.T)
      misuse("{}: query window [{}, {}) is not inside the sequence of {}", name, op.query_begin,
             op.query_begin + op.query_rows, d.T);
    if (op.bias.defined() || op.mask.defined()) misuse("{}: a query window takes no bias or mask", name);
    d.q0 = op.query_begin, d.Q = op.query_rows;
  }
  if (op.sliding_window < 0 || (op.sliding_window > 0 && !op.causal))
    misuse("{}: sliding window {} must be >= 0 and only on causal attention", name, op.sliding_window);
  if (op.sinks.defined()) expect_numel(op.sinks, d.H, name, "sinks (H)");
  if (op.bias.defined()) expect_numel(op.bias, d.T * d.T * d.H, name, "bias (T, T, H)");
  if (op.mask.defined()) {
    const std::int64_t windows = op.mask.numel() / std::max<std::int64_t>(1, d.T * d.T);
    if (windows < 1 || op.mask.numel() != windows * d.T * d.T || d.B % windows != 0)
      misuse("{}: mask {} must be (W, T, T) with T = {} and W dividing the batch {}", name,
             op.mask.shape().str(), d.T, d.B);
  }
  return d;
}

// (T, T, H) -> (H, T, T), the layout the kernel walks a query row in.
std::vector<float> heads_first(const float* x, std::int64_t T, std::int64_t H) {
  std::vector<float> out(static_cast<std::size_t>(T * T * H));
  for (std::int64_t ij = 0; ij < T * T; ++ij)
    for (std::int64_t h = 0; h < H; ++h) out[static_cast<std::size_t>(h * T * T + ij)] = x[ij * H + h];
  return out;
}
}  // namespace

cpu::ScoreTerms<float> CpuBackend::score_terms(const AttentionOp& op, const cpu::AttentionDims& d,
                                                std::string_view name, std::vector<float>& bias_scratch) const {
  cpu::ScoreTerms<float> terms;
  terms.causal = op.causal;
  terms.sliding_window = op.sliding_window;
  if (op.sinks.defined()) terms.sinks = f32(op.sinks, name);
  if (op.bias.defined()) {
    bias_scratch = heads_first(f32(op.bias, name), d.T, d.H);
    terms.bias = bias_scratch.data();
  }
  if (op.mask.defined()) {
    terms.mask = f32(op.mask, name);
    terms.windows = op.mask.numel() / (d.T * d.T);
  }
  return terms;
}

void CpuBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                   const AttentionOp& op) {
  constexpr std::string_view name = "attention_forward";
  const cpu::AttentionDims d = attention_dims(qkv, op, name);
  expect_numel(out, d.B * d.rows() * d.H * d.D, name, "out");
  expect_numel(lse, d.B * d.H * d.rows(), name, "lse");
  const float* pq = f32(qkv, name);
  float *po = f32(out, name), *pl = f32(lse, name);
  std::vector<float> bias;
  const cpu::ScoreTerms<float> terms = score_terms(op, d, name, bias);
  if (error_) return;
  const auto threads = on_threads();
  cpu::attention_forward(d, op.scale, pq, po, pl, terms);
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, Tensor& dqkv, const AttentionOp& op) {
  constexpr std::string_view name = "attention_backward";
  const cpu::AttentionDims d = attention_dims(qkv, op, name);
  expect_numel(dout, d.B * d.rows() * d.H * d.D, name, "dout");
  expect_numel(out, d.B * d.rows() * d.H * d.D, name, "out");
  expect_numel(lse, d.B * d.H * d.rows(), name, "lse");
  expect_numel(dqkv, qkv.numel(), name, "dqkv");
  const float *pd = f32(dout, name), *pq = f32(qkv, name), *po = f32(out, name),
              *pl = f32(lse, name);
  float* pdq = f32(dqkv, name);
  std::vector<float> bias;
  const cpu::ScoreTerms<float> terms = score_terms(op, d, name, bias);
  if (op.bias.defined() && !op.dbias.defined()) misuse("{}: a bias needs a dbias output", name);
  float* pdb = op.bias.defined() ? f32(op.dbias, name) : nullptr;
  if (pdb != nullptr) expect_numel(op.dbias, d.T * d.T * d.H, name, "dbias (T, T, H)");
  if (op.sinks.defined() && !op.dsinks.defined()) misuse("{}: sinks need a dsinks output", name);
  float* pds = op.sinks.defined() ? f32(op.dsinks, name) : nullptr;
  if (pds != nullptr) expect_numel(op.dsinks, d.H, name, "dsinks (H)");
  if (error_) return;
  const auto threads = on_threads();
  // Each (b, h) sink gradient is kept, then added over b in ascending order:
  // the same bits whatever the threads.
  std::vector<double> dsinks(pds != nullptr ? static_cast<std::size_t>(d.B * d.H) : 0);
  double* psinks = pds != nullptr ? dsinks.data() : nullptr;
  auto add_sinks = [&] {
    for (std::int64_t h = 0; h < d.H && pds != nullptr; ++h) {
      double acc = 0.0;
      for (std::int64_t b = 0; b < d.B; ++b) acc += dsinks[static_cast<std::size_t>(b * d.H + h)];
      pds[h] += static_cast<float>(acc);
    }
  };
  if (pdb == nullptr) {
    cpu::attention_backward(d, op.scale, pd, pq, po, pl, pdq, terms, static_cast<float*>(nullptr), psinks);
    return add_sinks();
  }
  // Every (b, h) score gradient is kept, then summed over b in ascending order
  // (in double) into the (T, T, H) layout: the same bits whatever the threads.
  std::vector<float> dscores(static_cast<std::size_t>(d.B * d.H * d.T * d.T));
  cpu::attention_backward(d, op.scale, pd, pq, po, pl, pdq, terms, dscores.data(), psinks);
  add_sinks();
  const std::int64_t TT = d.T * d.T;
  cpu::for_rows(TT, d.H * d.B, [&](std::int64_t ij) {
    for (std::int64_t h = 0; h < d.H; ++h) {
      double acc = 0.0;
      for (std::int64_t b = 0; b < d.B; ++b) acc += dscores[static_cast<std::size_t>((b * d.H + h) * TT + ij)];
      pdb[ij * d.H + h] = static_cast<float>(acc);
    }
  });
}

// ---- cross-entropy ---------------------------------------------------------------------

void CpuBackend::cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                                        bool accumulate) {
  constexpr std::string_view op = "cross_entropy_accuracy";
  expect_numel(target_logit, row_max.numel(), op, "target_logit");
  expect_numel(correct, 1, op, "correct");
  const float *pm = f32(row_max, op), *pt = f32(target_logit, op);
  float* pc = f32(correct, op);
  if (error_) return;
  std::int64_t hits = 0;
  for (std::int64_t i = 0; i < row_max.numel(); ++i) hits += pt[i] >= pm[i] ? 1 : 0;
  pc[0] = static_cast<float>(hits) + (accumulate ? pc[0] : 0.f);
}

void CpuBackend::cross_entropy_max(const Tensor& logits, Tensor& row_max) {
  const float* pl = f32(logits, "cross_entropy_max");
  float* pm = f32(row_max, "cross_entropy_max");
  const Matrix ml = as_matrix(logits, "cross_entropy_max");
  expect_numel(row_max, ml.rows, "cross_entropy_max", "row_max");
  if (error_) return;
  const auto threads = on_threads();
  cpu::cross_entropy_max(ml.rows, ml.cols, pl, pm);
}

void CpuBackend::cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, std::int64_t vocab_offset,
                                        Tensor& sumexp, Tensor& target_logit) {
  constexpr std::string_view op = "cross_entropy_partials";
  const Matrix ml = as_matrix(logits, op);
  expect_numel(targets, ml.rows, op, "targets");
  expect_numel(row_max, ml.rows, op, "row_max");
  expect_numel(sumexp, ml.rows, op, "sumexp");
  expect_numel(target_logit, ml.rows, op, "target_logit");
  const float *pl = f32(logits, op), *pm = f32(row_max, op);
  const std::int32_t* pt = i32(targets, op);
  float *ps = f32(sumexp, op), *ptl = f32(target_logit, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::cross_entropy_partials(ml.rows, ml.cols, pl, pt, pm, vocab_offset, ps, ptl);
}

void CpuBackend::cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                    const Tensor& target_logit, Tensor& losses) {
  constexpr std::string_view op = "cross_entropy_loss";
  const std::int64_t N = row_max.numel();
  expect_numel(sumexp, N, op, "sumexp");
  expect_numel(target_logit, N, op, "target_logit");
  expect_numel(losses, N, op, "losses");
  const float *pm = f32(row_max, op), *ps = f32(sumexp, op), *pt = f32(target_logit, op);
  float* pl = f32(losses, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::cross_entropy_loss(N, pm, ps, pt, pl);
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, const Tensor& sumexp,
                                        std::int64_t vocab_offset, float dloss, Tensor& dlogits) {
  constexpr std::string_view op = "cross_entropy_backward";
  const Matrix ml = as_matrix(logits, op);
  expect_numel(targets, ml.rows, op, "targets");
  expect_numel(row_max, ml.rows, op, "row_max");
  expect_numel(sumexp, ml.rows, op, "sumexp");
  expect_numel(dlogits, logits.numel(), op, "dlogits");
  const float *pl = f32(logits, op), *pm = f32(row_max, op), *ps = f32(sumexp, op);
  const std::int32_t* pt = i32(targets, op);
  float* pd = f32(dlogits, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::cross_entropy_backward(ml.rows, ml.cols, pl, pt, pm, ps, vocab_offset, dloss, pd);
}

// ---- optimizer -------------------------------------------------------------------------

void CpuBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) {
  const float* ps = f32(sumsq, "clip_coefficient");
  float* pc = f32(coef, "clip_coefficient");
  expect_numel(sumsq, 1, "clip_coefficient", "sumsq");
  expect_numel(coef, 1, "clip_coefficient", "coef");
  if (error_) return;
  const auto threads = on_threads();
  *pc = cpu::clip_coefficient(*ps, max_norm);
}

void CpuBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
                       const AdamWOp& op) {
  const std::int64_t n = param.numel();
  expect_numel(grad, n, "adamw", "grad");
  expect_numel(m, n, "adamw", "m");
  expect_numel(v, n, "adamw", "v");
  if (op.step < 1) misuse("adamw: step {} must be 1-based", op.step);
  float *pp = f32(param, "adamw"), *pm = f32(m, "adamw"), *pv = f32(v, "adamw");
  const float* pg = f32(grad, "adamw");
  const float* pc = nullptr;
  if (coef.defined()) {
    expect_numel(coef, 1, "adamw", "coef");
    pc = f32(coef, "adamw");
  }
  if (error_) return;
  const auto threads = on_threads();
  const cpu::AdamWParams p{op.lr, op.beta1, op.beta2, op.eps, op.weight_decay, op.step, op.variance_frozen_at};
  cpu::adamw(n, pp, pg, pm, pv, pc ? *pc : 1.0f, p);
}

void CpuBackend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  float* po = f32(out, "foreach_sum_squares");
  if (out.numel() != 1) misuse("foreach_sum_squares: out {} must have one element", out.shape().str());
  std::vector<const float*> ptrs;
  std::vector<std::int64_t> sizes;
  for (const Tensor& x : xs) {
    ptrs.push_back(f32(x, "foreach_sum_squares"));
    sizes.push_back(x.numel());
  }
  if (error_) return;
  const auto threads = on_threads();
  std::vector<double> sums(xs.size());
  cpu::foreach_sum_squares(xs.size(), ptrs.data(), sizes.data(), sums.data());
  // As sum_squares(x, out, true) for each x in turn: every sum rounded to fp32 as it is added.
  for (double s : sums) *po = static_cast<float>(static_cast<double>(*po) + s);
}

void CpuBackend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                               const AdamWOp& op) {
  if (op.step < 1) misuse("foreach_adamw: step {} must be 1-based", op.step);
  const float* pc = nullptr;
  if (coef.defined()) {
    expect_numel(coef, 1, "foreach_adamw", "coef");
    pc = f32(coef, "foreach_adamw");
  }
  if (coef.defined() && on_host(coef)) misuse("foreach_adamw: the clip coefficient must be in device memory");
  std::vector<cpu::AdamWArrays<float>> arrays;
  for (const AdamWTensors& t : params) {
    // All on the host (an offloaded update) or all on the device, as the cuda backend needs.
    const bool host = on_host(params.front().param);
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      if (on_host(*x) != host)
        misuse("foreach_adamw: {} tensor {} among {} tensors: an update runs all on the host or all on the device",
               on_host(*x) ? "a host" : "a device", x->shape().str(), host ? "host" : "device");
    const std::int64_t n = t.param.numel();
    expect_numel(t.grad, n, "foreach_adamw", "grad");
    expect_numel(t.m, n, "foreach_adamw", "m");
    expect_numel(t.v, n, "foreach_adamw", "v");
    const cpu::AdamWParams p{op.lr, op.beta1, op.beta2, op.eps, t.weight_decay, op.step, op.variance_frozen_at};
    arrays.push_back({n, f32(t.param, "foreach_adamw"), f32(t.grad, "foreach_adamw"), f32(t.m, "foreach_adamw"),
                      f32(t.v, "foreach_adamw"), cpu::AdamWStep<float>(p, 1.0f)});
  }
  if (error_) return;
  const auto threads = on_threads();
  for (auto& a : arrays) a.step.coef = pc ? *pc : 1.0f;
  cpu::foreach_adamw(arrays);
}

// ---- 1-bit gradient compression -----------------------------------------------------------

namespace {
// x (C, k) and packets (C, 1 + ceil(k/32)): the chunk count and size they agree on.
Matrix sign_packets(const Tensor& values, const Tensor& packets, std::string_view op) {
  const Matrix mx = as_matrix(values, op);
  const Matrix mp = as_matrix(packets, op);
  if (mp.rows != mx.rows || mp.cols != 1 + cpu::sign_words(mx.cols))
    misuse("{}: packets {} must be ({}, {}) for values {} (one scale word and ceil(k/32) sign words per chunk)", op,
           packets.shape().str(), mx.rows, 1 + cpu::sign_words(mx.cols), values.shape().str());
  return mx;
}
}  // namespace

void CpuBackend::sign_compress(const Tensor& x, Tensor& error, Tensor& packets) {
  constexpr std::string_view op = "sign_compress";
  const Matrix m = sign_packets(x, packets, op);
  if (error.defined()) expect_numel(error, x.numel(), op, "error");
  const float* px = f32(x, op);
  float* pe = error.defined() ? f32(error, op) : nullptr;
  std::int32_t* pp = i32(packets, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::sign_compress(m.rows, m.cols, px, pe, pp);
}

void CpuBackend::sign_decompress(const Tensor& packets, Tensor& out) {
  constexpr std::string_view op = "sign_decompress";
  const Matrix m = sign_packets(out, packets, op);
  const std::int32_t* pp = i32(packets, op);
  float* po = f32(out, op);
  if (error_) return;
  const auto threads = on_threads();
  cpu::sign_decompress(m.rows, m.cols, pp, po);
}

// ---- initialisation ----------------------------------------------------------------------

void CpuBackend::init_normal(Tensor& x, const NormalInitOp& op) {
  if (x.dtype() != DType::f32) {  // 16-bit values: drawn on the host, rounded by write
    Backend::init_normal(x, op);
    return;
  }
  float* px = f32(x, "init_normal");
  if (const auto bad = normal_init_misuse(x, op)) misuse("{}", *bad);
  if (error_) return;
  const auto threads = on_threads();
  cpu::init_normal(op, x.numel(), px);
}

}  // namespace meshtrain
