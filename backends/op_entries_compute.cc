// The table's compute ops (backends/op_table.h): elementwise, dense,
// embedding, index maps, mixture of experts, normalisation, activations and
// attention, in backend.h's order. Traffic weights count what the kernels
// read and write once each (an in-place update twice; a gather reads one
// row per output row, counted as the output's bytes again).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/op_entries.h"

namespace meshtrain::op_entries {
namespace {

using Sample = Result<OpSample>;
using SS = SampleShape;

// x (N, C) at the shape's dtype holding `value`.
Tensor act(Backend& b, const SS& s, float value) { return filled(b, Shape{s.rows, s.cols}, value, s.dtype); }

void append_elementwise(std::vector<OpInfo>& t) {
  t.push_back({.name = "fill",
               .cost_name = "fill",
               .cls = CostClass::memory,
               .operands = "x (N, C) written",
               .traffic = {1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor z = act(b, s, 0.f);
                 return sampled("fill", [=, &b]() mutable { b.fill(z, 1.f); }, {&z});
               }});
  t.push_back({.name = "copy",
               .cost_name = "copy",
               .cls = CostClass::memory,
               .operands = "src (N, C) -> dst (N, C), either may be in host memory",
               .traffic = {1, 1},
               .host_memory = true,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), z = act(b, s, 0.f);
                 return sampled("copy", [=, &b]() mutable { b.copy(x, z); }, {&x, &z});
               }});
  t.push_back({.name = "cast",
               .cost_name = "cast",
               .cls = CostClass::memory,
               .operands = "src (N, C) -> dst (N, C) of another float dtype",
               .traffic = {1, 1},
               .shape_of = 1,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 // The step casts fp32 master weights to the compute dtype and half-width gradients to fp32.
                 Tensor from = filled(b, Shape{s.rows, s.cols}, 0.5f, s.dtype == DType::f32 ? DType::bf16 : DType::f32);
                 Tensor z = act(b, s, 0.f);
                 return sampled("cast", [=, &b]() mutable { b.cast(from, z); }, {&from, &z});
               }});
  t.push_back({.name = "add",
               .cost_name = "add",
               .cls = CostClass::memory,
               .operands = "a, b -> out, all (N, C)",
               .traffic = {1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), y = act(b, s, 0.25f), z = act(b, s, 0.f);
                 return sampled("add", [=, &b]() mutable { b.add(x, y, z); }, {&x, &y, &z});
               }});
  t.push_back({.name = "scale",
               .cost_name = "scale",
               .cls = CostClass::memory,
               .operands = "x (N, C) in place",
               .traffic = {2},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor z = act(b, s, 1.f);
                 return sampled("scale", [=, &b]() mutable { b.scale(z, 0.999f); }, {&z});
               }});
  t.push_back({.name = "axpy",
               .cost_name = "axpy",
               .cls = CostClass::memory,
               .operands = "x (N, C), y (N, C) += a·x",
               .traffic = {1, 2},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), z = act(b, s, 0.f);
                 return sampled("axpy", [=, &b]() mutable { b.axpy(0.5f, x, z); }, {&x, &z});
               }});
  t.push_back({.name = "sum",
               .cost_name = "sum",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> out (1) f32",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), one = filled(b, Shape{1}, 0.f);
                 return sampled("sum", [=, &b]() mutable { b.sum(x, one, 1.f, false); }, {&x, &one});
               }});
  t.push_back({.name = "sum_squares",
               .cost_name = "sum_squares",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> out (1) f32",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), one = filled(b, Shape{1}, 0.f);
                 return sampled("sum_squares", [=, &b]() mutable { b.sum_squares(x, one, false); }, {&x, &one});
               }});
  t.push_back({.name = "amax",
               .cost_name = "amax",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> out (1) f32",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.3f), one = filled(b, Shape{1}, 0.f);
                 return sampled("amax", [=, &b]() mutable { b.amax(x, one); }, {&x, &one});
               }});
  t.push_back({.name = "fp8_cast",
               .cost_name = "fp8_cast",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> y (N, C), amax (1) f32",
               .shape_of = 0,
               .cost = fp8_cast_cost,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.3f), y = act(b, s, 0.f), amax = filled(b, Shape{1}, 0.f);
                 const Fp8CastOp op{};
                 OpArgs args;
                 args.fp8_cast = &op;
                 return sampled("fp8_cast", [=, &b]() mutable { b.fp8_cast(x, op, y, amax); }, {&x, &y, &amax},
                                args);
               }});
}

void append_dense(std::vector<OpInfo>& t) {
  // m = rows, n = k = cols.
  t.push_back({.name = "gemm",
               .cost_name = "gemm",
               .cls = CostClass::gemm,
               .operands = "a (m, k), b (k, n), c (m, n), bias (n) optional",
               .cost = gemm_cost,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor a = filled(b, Shape{s.rows, s.cols}, 0.01f, s.dtype),
                        w = filled(b, Shape{s.cols, s.cols}, 0.01f, s.dtype);
                 Tensor c = filled(b, Shape{s.rows, s.cols}, 0.f, s.dtype), none;
                 return sampled("gemm", [=, &b]() mutable { b.gemm(a, w, c, GemmOp{}); }, {&a, &w, &c, &none});
               }});
  t.push_back(
      {.name = "batched_gemm",
       .cost_name = "batched_gemm",
       .cls = CostClass::gemm,
       .operands = "a (L, m, k), b (L, k, n), c (L, m, n), bias (n) optional",
       .cost = batched_gemm_cost,
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor a = filled(b, Shape{2, s.rows, s.cols}, 0.01f, s.dtype);
         Tensor w = filled(b, Shape{2, s.cols, s.cols}, 0.01f, s.dtype),
                c = filled(b, Shape{2, s.rows, s.cols}, 0.f, s.dtype), none;
         return sampled("batched_gemm", [=, &b]() mutable { b.batched_gemm(a, w, c, GemmOp{}); }, {&a, &w, &c, &none});
       }});
  t.push_back({.name = "grouped_gemm",
               .cost_name = "grouped_gemm",
               .cls = CostClass::gemm,
               .operands = "per group g: a[g] (m_g, k), b[g] (k, n), c[g] (m_g, n)",
               .cost = grouped_gemm_cost,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 // Two experts over uneven shares of the tokens.
                 const std::int64_t m0 = std::max<std::int64_t>(1, s.rows / 4), m1 = s.rows;
                 std::vector<Tensor> a = {filled(b, Shape{m0, s.cols}, 0.01f, s.dtype),
                                          filled(b, Shape{m1, s.cols}, 0.01f, s.dtype)};
                 std::vector<Tensor> w = {filled(b, Shape{s.cols, s.cols}, 0.01f, s.dtype),
                                          filled(b, Shape{s.cols, s.cols}, 0.02f, s.dtype)};
                 std::vector<Tensor> c = {filled(b, Shape{m0, s.cols}, 0.f, s.dtype),
                                          filled(b, Shape{m1, s.cols}, 0.f, s.dtype)};
                 return sampled("grouped_gemm", [=, &b]() mutable { b.grouped_gemm(a, w, c, GemmOp{}); },
                                {&a[0], &w[0], &c[0], &a[1], &w[1], &c[1]});
               }});
  t.push_back({.name = "bias_backward",
               .cost_name = "bias_backward",
               .cls = CostClass::memory,
               .operands = "dy (m, n) -> db (n) f32 +=",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), db = filled(b, Shape{s.cols}, 0.f);
                 return sampled("bias_backward", [=, &b]() mutable { b.bias_backward(x, db); }, {&x, &db});
               }});
}

void append_embedding_and_maps(std::vector<OpInfo>& t) {
  // The table has `cols` rows of width cols: a (V, C) table with V = C.
  t.push_back({.name = "embedding_forward",
               .cost_name = "embedding_forward",
               .cls = CostClass::memory,
               .operands = "table (V, C), ids (N) i32 -> out (N, C)",
               .traffic = {0, 1, 2},
               .shape_of = 2,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor table = filled(b, Shape{s.cols, s.cols}, 0.1f, s.dtype), tok = ids(b, s.rows, s.cols);
                 Tensor e = act(b, s, 0.f);
                 return sampled("embedding_forward", [=, &b]() mutable { b.embedding_forward(table, tok, e, 0); },
                                {&table, &tok, &e});
               }});
  t.push_back(
      {.name = "embedding_backward",
       .cost_name = "embedding_backward",
       .cls = CostClass::memory,
       .operands = "dout (N, C), ids (N) i32 -> dtable (V, C) f32 += by row",
       .traffic = {2, 1, 0},
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor x = act(b, s, 0.5f), tok = ids(b, s.rows, s.cols), dtable = filled(b, Shape{s.cols, s.cols}, 0.f);
         return sampled("embedding_backward", [=, &b]() mutable { b.embedding_backward(x, tok, dtable, 0); },
                        {&x, &tok, &dtable});
       }});
  t.push_back({.name = "gather_rows",
               .cost_name = "gather_rows",
               .cls = CostClass::memory,
               .operands = "src (M, X), index (N) i32 -> out (N, X)",
               .traffic = {0, 1, 2},
               .shape_of = 2,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 // A map of the rows of x onto themselves, as the window partition issues one.
                 Tensor x = act(b, s, 0.5f), index = ids(b, s.rows, s.rows), z = act(b, s, 0.f);
                 return sampled("gather_rows", [=, &b]() mutable { b.gather_rows(x, index, z); }, {&x, &index, &z});
               }});
}

// Router over E = cols experts, K = min(2, E) of them per token.
struct Routed {
  Tensor logits, probs, lse, weights, experts;
};
Routed route(Backend& b, const SS& s) {
  const std::int64_t k = std::min<std::int64_t>(2, s.cols);
  Routed r{filled(b, Shape{s.rows, s.cols}, 0.f), filled(b, Shape{s.rows, s.cols}, 0.f), filled(b, Shape{s.rows}, 0.f),
           filled(b, Shape{s.rows, k}, 0.f), b.empty(Shape{s.rows, k}, DType::i32)};
  b.moe_route(r.logits, true, r.probs, r.lse, r.weights, r.experts);
  return r;
}
// Token n's slot k reads row n·K + k of the expert outputs: each row read once.
Tensor slots(Backend& b, std::int64_t n, std::int64_t k) {
  std::vector<std::int32_t> host(static_cast<std::size_t>(n * k));
  std::iota(host.begin(), host.end(), 0);
  Tensor x = b.empty(Shape{n, k}, DType::i32);
  b.write(x, host);
  return x;
}

void append_moe(std::vector<OpInfo>& t) {
  t.push_back({.name = "moe_route",
               .cost_name = "moe_route",
               .cls = CostClass::memory,
               .operands = "logits (N, E) f32 -> probs (N, E), lse (N), weights (N, K) f32, experts (N, K) i32",
               .traffic = {1, 1, 1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Routed r = route(b, s);
                 return sampled(
                     "moe_route",
                     [=, &b]() mutable { b.moe_route(r.logits, true, r.probs, r.lse, r.weights, r.experts); },
                     {&r.logits, &r.probs, &r.lse, &r.weights, &r.experts});
               }});
  t.push_back(
      {.name = "moe_route_backward",
       .cost_name = "moe_route_backward",
       .cls = CostClass::memory,
       .operands = "dweights (N, K), probs (N, E), lse (N), experts (N, K) i32, prob_grad (E) -> dlogits (N, E)",
       .traffic = {1, 1, 1, 1, 1, 1},
       .shape_of = 1,
       .sample = [](Backend& b, const SS& s) -> Sample {
         Routed r = route(b, s);
         Tensor dw = filled(b, r.weights.shape(), 0.1f), pg = filled(b, Shape{s.cols}, 0.01f);
         Tensor dl = filled(b, Shape{s.rows, s.cols}, 0.f);
         return sampled("moe_route_backward",
                        [=, &b]() mutable { b.moe_route_backward(dw, r.probs, r.lse, r.experts, pg, 1e-3f, true, dl); },
                        {&dw, &r.probs, &r.lse, &r.experts, &pg, &dl});
       }});
  t.push_back({.name = "moe_combine",
               .cost_name = "moe_combine",
               .cls = CostClass::memory,
               .operands = "rows (M, C), index (N, K) i32, weights (N, K) f32 -> out (N, C)",
               .traffic = {1, 1, 1, 1},
               .shape_of = 3,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor rows = filled(b, Shape{2 * s.rows, s.cols}, 0.5f, s.dtype), index = slots(b, s.rows, 2);
                 Tensor w = filled(b, Shape{s.rows, 2}, 0.5f), out = act(b, s, 0.f);
                 return sampled("moe_combine", [=, &b]() mutable { b.moe_combine(rows, index, w, out); },
                                {&rows, &index, &w, &out});
               }});
  t.push_back(
      {.name = "moe_combine_backward",
       .cost_name = "moe_combine_backward",
       .cls = CostClass::memory,
       .operands = "dout (N, C), rows (M, C), index (N, K) i32, weights (N, K) -> drows (M, C), dweights (N, K)",
       .traffic = {1, 1, 1, 1, 1, 1},
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor dout = act(b, s, 0.1f), rows = filled(b, Shape{2 * s.rows, s.cols}, 0.5f, s.dtype);
         Tensor index = slots(b, s.rows, 2), w = filled(b, Shape{s.rows, 2}, 0.5f);
         Tensor drows = filled(b, rows.shape(), 0.f, s.dtype), dw = filled(b, w.shape(), 0.f);
         return sampled("moe_combine_backward",
                        [=, &b]() mutable { b.moe_combine_backward(dout, rows, index, w, drows, dw); },
                        {&dout, &rows, &index, &w, &drows, &dw});
       }});
}

void append_norms(std::vector<OpInfo>& t) {
  t.push_back({.name = "layernorm_forward",
               .cost_name = "layernorm_forward",
               .cls = CostClass::memory,
               .operands = "x (N, C), weight (C), bias (C) -> out (N, C), mean (N), rstd (N) f32",
               .traffic = {1, 1, 1, 1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), row = filled(b, Shape{s.cols}, 1.f, s.dtype), z = act(b, s, 0.f);
                 Tensor mean = filled(b, Shape{s.rows}, 0.f), rstd = filled(b, Shape{s.rows}, 1.f);
                 return sampled("layernorm_forward",
                                [=, &b]() mutable { b.layernorm_forward(x, row, row, z, mean, rstd, 1e-5f); },
                                {&x, &row, &row, &z, &mean, &rstd});
               }});
  t.push_back({.name = "layernorm_backward",
               .cost_name = "layernorm_backward",
               .cls = CostClass::memory,
               .operands = "dout, x (N, C), weight (C), mean, rstd (N) -> dx (N, C), dweight, dbias (C) f32 +=",
               .traffic = {1, 1, 1, 1, 1, 1, 1, 1},
               .shape_of = 1,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor y = act(b, s, 0.25f), x = act(b, s, 0.5f), row = filled(b, Shape{s.cols}, 1.f, s.dtype);
                 Tensor mean = filled(b, Shape{s.rows}, 0.f), rstd = filled(b, Shape{s.rows}, 1.f), z = act(b, s, 0.f);
                 Tensor dw = filled(b, Shape{s.cols}, 0.f), db = filled(b, Shape{s.cols}, 0.f);
                 return sampled("layernorm_backward",
                                [=, &b]() mutable { b.layernorm_backward(y, x, row, mean, rstd, z, dw, db); },
                                {&y, &x, &row, &mean, &rstd, &z, &dw, &db});
               }});
  t.push_back({.name = "rmsnorm_forward",
               .cost_name = "rmsnorm_forward",
               .cls = CostClass::memory,
               .operands = "x (N, C), weight (C) -> out (N, C), rstd (N) f32",
               .traffic = {1, 1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), row = filled(b, Shape{s.cols}, 1.f, s.dtype), z = act(b, s, 0.f);
                 Tensor rstd = filled(b, Shape{s.rows}, 1.f);
                 return sampled("rmsnorm_forward", [=, &b]() mutable { b.rmsnorm_forward(x, row, z, rstd, 1e-5f); },
                                {&x, &row, &z, &rstd});
               }});
  t.push_back({.name = "rmsnorm_backward",
               .cost_name = "rmsnorm_backward",
               .cls = CostClass::memory,
               .operands = "dout, x (N, C), weight (C), rstd (N) -> dx (N, C), dweight (C) f32 +=",
               .traffic = {1, 1, 1, 1, 1, 1},
               .shape_of = 1,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor y = act(b, s, 0.25f), x = act(b, s, 0.5f), row = filled(b, Shape{s.cols}, 1.f, s.dtype);
                 Tensor rstd = filled(b, Shape{s.rows}, 1.f), z = act(b, s, 0.f), dw = filled(b, Shape{s.cols}, 0.f);
                 return sampled("rmsnorm_backward", [=, &b]() mutable { b.rmsnorm_backward(y, x, row, rstd, z, dw); },
                                {&y, &x, &row, &rstd, &z, &dw});
               }});
}

void append_activations(std::vector<OpInfo>& t) {
  t.push_back({.name = "gelu_forward",
               .cost_name = "gelu_forward",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> out (N, C)",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), z = act(b, s, 0.f);
                 return sampled("gelu_forward", [=, &b]() mutable { b.gelu_forward(x, z); }, {&x, &z});
               }});
  t.push_back({.name = "gelu_backward",
               .cost_name = "gelu_backward",
               .cls = CostClass::memory,
               .operands = "dout, x (N, C) -> dx (N, C)",
               .traffic = {1, 1, 1},
               .shape_of = 1,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor y = act(b, s, 0.25f), x = act(b, s, 0.5f), z = act(b, s, 0.f);
                 return sampled("gelu_backward", [=, &b]() mutable { b.gelu_backward(y, x, z); }, {&y, &x, &z});
               }});
  // x (N, 2C) = [gate | up] -> out (N, C).
  t.push_back({.name = "swiglu_forward",
               .cost_name = "swiglu_forward",
               .cls = CostClass::memory,
               .operands = "x (N, 2F) -> out (N, F)",
               .traffic = {1, 1},
               .shape_of = 1,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = filled(b, Shape{s.rows, 2 * s.cols}, 0.5f, s.dtype), z = act(b, s, 0.f);
                 return sampled("swiglu_forward", [=, &b]() mutable { b.swiglu_forward(x, z); }, {&x, &z});
               }});
  t.push_back({.name = "swiglu_backward",
               .cost_name = "swiglu_backward",
               .cls = CostClass::memory,
               .operands = "dout (N, F), x (N, 2F) -> dx (N, 2F)",
               .traffic = {1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor y = act(b, s, 0.25f), x = filled(b, Shape{s.rows, 2 * s.cols}, 0.5f, s.dtype);
                 Tensor dx = filled(b, x.shape(), 0.f, s.dtype);
                 return sampled("swiglu_backward", [=, &b]() mutable { b.swiglu_backward(y, x, dx); }, {&y, &x, &dx});
               }});
  t.push_back({.name = "dropout_forward",
               .cost_name = "dropout_forward",
               .cls = CostClass::memory,
               .operands = "x (N, C) -> out (N, C)",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor x = act(b, s, 0.5f), z = act(b, s, 0.f);
                 return sampled("dropout_forward",
                                [=, &b]() mutable {
                                  b.dropout_forward(x, z, DropoutOp{0.1f, 7, 0});
                                },
                                {&x, &z});
               }});
  t.push_back({.name = "dropout_backward",
               .cost_name = "dropout_backward",
               .cls = CostClass::memory,
               .operands = "dout (N, C) -> dx (N, C)",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Tensor y = act(b, s, 0.25f), z = act(b, s, 0.f);
                 return sampled("dropout_backward",
                                [=, &b]() mutable {
                                  b.dropout_backward(y, z, DropoutOp{0.1f, 7, 0});
                                },
                                {&y, &z});
               }});
}

// Attention over B = 1, T = rows, H = G = 2 heads of D = cols.
AttentionOp sample_attention(const SS& s) {
  AttentionOp op;
  op.heads = op.kv_heads = 2;
  op.head_dim = static_cast<int>(s.cols);
  op.scale = 1.f / std::sqrt(static_cast<float>(s.cols));
  return op;
}

void append_attention(std::vector<OpInfo>& t) {
  // Only the rotated heads' bytes move: OpArgs::share.
  t.push_back({.name = "rope",
               .cost_name = "rope",
               .cls = CostClass::memory,
               .operands = "x (B, T, heads, D) in place, its first rotate_heads heads",
               .traffic = {2},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 // One head of D = cols over T = rows positions: x viewed as (rows, cols), as calibration records it.
                 Tensor x = filled(b, Shape{1, s.rows, 1, s.cols}, 0.5f, s.dtype);
                 return sampled("rope", [=, &b]() mutable { b.rope(x, 1, 1, 10000.f, false, 0); }, {&x});
               }});
  t.push_back(
      {.name = "attention_forward",
       .cost_name = "attention_forward",
       .cls = CostClass::attention,
       .operands = "qkv (B, T, H + 2G, D) -> out (B, T, H, D), lse (B, H, T) f32",
       .cost = attention_forward_cost,
       .sample = [](Backend& b, const SS& s) -> Sample {
         const AttentionOp op = sample_attention(s);
         Tensor qkv = filled(b, Shape{1, s.rows, 6, s.cols}, 0.1f, s.dtype);
         Tensor out = filled(b, Shape{1, s.rows, 2, s.cols}, 0.f, s.dtype), lse = filled(b, Shape{1, 2, s.rows}, 0.f);
         OpArgs a;
         a.attention = &op;
         return sampled(
             "attention_forward", [=, &b]() mutable { b.attention_forward(qkv, out, lse, op); }, {&qkv, &out, &lse}, a);
       }});
  t.push_back(
      {.name = "attention_backward",
       .cost_name = "attention_backward",
       .cls = CostClass::attention,
       .operands = "dout, qkv, out, lse (as forward) -> dqkv (B, T, H + 2G, D)",
       .cost = attention_backward_cost,
       .sample = [](Backend& b, const SS& s) -> Sample {
         const AttentionOp op = sample_attention(s);
         Tensor qkv = filled(b, Shape{1, s.rows, 6, s.cols}, 0.1f, s.dtype);
         Tensor out = filled(b, Shape{1, s.rows, 2, s.cols}, 0.f, s.dtype), lse = filled(b, Shape{1, 2, s.rows}, 0.f);
         b.attention_forward(qkv, out, lse, op);
         Tensor dout = filled(b, out.shape(), 0.01f, s.dtype), dqkv = filled(b, qkv.shape(), 0.f, s.dtype);
         OpArgs a;
         a.attention = &op;
         return sampled(
             "attention_backward", [=, &b]() mutable { b.attention_backward(dout, qkv, out, lse, dqkv, op); },
             {&dout, &qkv, &out, &lse, &dqkv}, a);
       }});
  t.push_back(
      {.name = "attention_merge",
       .cost_name = "attention_merge",
       .cls = CostClass::memory,
       .operands = "out (B, Q, H, D), lse (B, H, Q) f32 in place, part_out, part_lse",
       .traffic = {2, 2, 1, 1},
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor out = filled(b, Shape{1, s.rows, 1, s.cols}, 0.5f, s.dtype), lse = filled(b, Shape{1, 1, s.rows}, 0.f);
         Tensor po = filled(b, out.shape(), 0.25f, s.dtype), pl = filled(b, lse.shape(), -1.f);
         return sampled("attention_merge", [=, &b]() mutable { b.attention_merge(out, lse, po, pl); },
                        {&out, &lse, &po, &pl});
       }});
}

}  // namespace

void append_compute(std::vector<OpInfo>& table) {
  append_elementwise(table);
  append_dense(table);
  append_embedding_and_maps(table);
  append_moe(table);
  append_norms(table);
  append_activations(table);
  append_attention(table);
}

}  // namespace meshtrain::op_entries
