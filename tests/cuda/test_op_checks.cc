// Shape and dtype rules of the cuda ops, checked without a device: tensors
// here are shapes over an empty storage, never touched.
#include <catch2/catch.hpp>

#include "backends/cuda/op_checks.h"

using namespace meshtrain;
using namespace meshtrain::cuda;

namespace {
Tensor t(Shape s, DType d = DType::f32) {
  return Tensor(std::make_shared<Storage>(), std::move(s), d);
}
}  // namespace

TEST_CASE("gemm dims follow the transposes") {
  auto d = gemm_dims(t({4, 3}), t({3, 5}), t({4, 5}), GemmOp{});
  REQUIRE(d.ok());
  CHECK((d->m == 4 && d->n == 5 && d->k == 3 && d->batch == 1));
  GemmOp tt;
  tt.trans_a = tt.trans_b = true;
  d = gemm_dims(t({3, 4}), t({5, 3}), t({4, 5}), tt);
  REQUIRE(d.ok());
  CHECK((d->m == 4 && d->n == 5 && d->k == 3));
  // Rank > 2 is viewed as (numel / X, X).
  d = gemm_dims(t({2, 2, 3}), t({3, 5}), t({4, 5}), GemmOp{});
  REQUIRE(d.ok());
  CHECK(d->m == 4);
  auto bad = gemm_dims(t({4, 3}), t({4, 5}), t({4, 5}), GemmOp{});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("do not fit"));
}

TEST_CASE("gemm dtypes: shared input dtype, f32 or input-dtype output, bias as c") {
  CHECK(gemm_dims(t({4, 3}, DType::bf16), t({3, 5}, DType::bf16), t({4, 5}), GemmOp{}).ok());
  CHECK(gemm_dims(t({4, 3}, DType::bf16), t({3, 5}, DType::bf16), t({4, 5}, DType::bf16), GemmOp{}).ok());
  CHECK_FALSE(gemm_dims(t({4, 3}, DType::bf16), t({3, 5}), t({4, 5}), GemmOp{}).ok());
  CHECK_FALSE(gemm_dims(t({4, 3}, DType::bf16), t({3, 5}, DType::bf16), t({4, 5}, DType::f16), GemmOp{}).ok());
  CHECK_FALSE(gemm_dims(t({4, 3}, DType::i32), t({3, 5}, DType::i32), t({4, 5}), GemmOp{}).ok());
  GemmOp with_bias;
  with_bias.bias = t({5}, DType::bf16);
  CHECK_FALSE(gemm_dims(t({4, 3}), t({3, 5}), t({4, 5}), with_bias).ok());
  with_bias.bias = t({5});
  CHECK(gemm_dims(t({4, 3}), t({3, 5}), t({4, 5}), with_bias).ok());
  with_bias.bias = t({4});
  CHECK_FALSE(gemm_dims(t({4, 3}), t({3, 5}), t({4, 5}), with_bias).ok());
}

TEST_CASE("batched gemm needs one L") {
  auto d = batched_gemm_dims(t({2, 4, 3}), t({2, 3, 5}), t({2, 4, 5}), GemmOp{});
  REQUIRE(d.ok());
  CHECK(d->batch == 2);
  CHECK_FALSE(batched_gemm_dims(t({2, 4, 3}), t({3, 3, 5}), t({2, 4, 5}), GemmOp{}).ok());
  CHECK_FALSE(batched_gemm_dims(t({4, 3}), t({3, 5}), t({4, 5}), GemmOp{}).ok());
}

TEST_CASE("attention takes (B, T, H + 2G, D) with D even and at most 128") {
  AttentionOp op{4, 2, 64, 0.125f};
  auto d = attention_dims(t({2, 8, 8, 64}), op);
  REQUIRE(d.ok());
  CHECK((d->B == 2 && d->T == 8 && d->H == 4 && d->G == 2 && d->D == 64));
  CHECK(attention_dims(t({2, 8, 8, 64}, DType::bf16), op).ok());
  CHECK(attention_dims(t({2, 8, 8, 64}, DType::f16), op).ok());
  CHECK_FALSE(attention_dims(t({2, 8, 8, 64}, DType::i32), op).ok());
  CHECK_FALSE(attention_dims(t({2, 8, 7, 64}), op).ok());
  AttentionOp wide{4, 2, 256, 0.0625f};
  auto w = attention_dims(t({2, 8, 8, 256}), wide);
  REQUIRE_FALSE(w.ok());
  CHECK_THAT(w.error().message(), Catch::Contains("head dim 256"));
  AttentionOp uneven{3, 2, 64, 0.125f};
  CHECK_FALSE(attention_dims(t({2, 8, 7, 64}), uneven).ok());
}

TEST_CASE("the flash kernels refuse a sliding window and attention sinks, naming the cpu backend") {
  AttentionOp op;
  op.heads = 4, op.kv_heads = 2, op.head_dim = 64, op.scale = 0.125f;
  op.sliding_window = 16;
  auto windowed = attention_dims(t({2, 8, 8, 64}), op);
  REQUIRE_FALSE(windowed.ok());
  CHECK_THAT(windowed.error().message(), Catch::Contains("sliding-window") && Catch::Contains("cpu backend"));
  op.sliding_window = 0;
  op.sinks = t({4});
  CHECK_FALSE(attention_dims(t({2, 8, 8, 64}), op).ok());
}

TEST_CASE("attention's query window lies inside the sequence and takes no bias or mask") {
  AttentionOp op{4, 2, 64, 0.125f};
  op.query_begin = 3;
  op.query_rows = 4;
  auto d = attention_dims(t({2, 8, 8, 64}), op);
  REQUIRE(d.ok());
  CHECK((d->q0 == 3 && d->Q == 4 && d->rows() == 4 && d->T == 8));
  op.query_rows = 0;  // no window: every row
  CHECK(attention_dims(t({2, 8, 8, 64}), op)->rows() == 8);
  op.query_rows = 6;  // [3, 9) runs past T = 8
  auto past = attention_dims(t({2, 8, 8, 64}), op);
  REQUIRE_FALSE(past.ok());
  CHECK_THAT(past.error().message(), Catch::Contains("[3, 9)") && Catch::Contains("sequence of 8"));
  op.query_begin = -1;
  op.query_rows = 2;
  CHECK_FALSE(attention_dims(t({2, 8, 8, 64}), op).ok());
  op.query_begin = 0;
  op.mask = t({1, 8, 8});
  auto masked = attention_dims(t({2, 8, 8, 64}), op);
  REQUIRE_FALSE(masked.ok());
  CHECK_THAT(masked.error().message(), Catch::Contains("no bias or mask"));
}

TEST_CASE("attention score terms: bias (T, T, H), mask (W, T, T) with W dividing B, dbias in backward") {
  const AttentionDims d{8, 49, 3, 3, 32};
  AttentionOp op;  // only the terms matter here
  op.causal = false;
  auto w = score_terms_check(op, d, DType::bf16, true);
  REQUIRE(w.ok());
  CHECK(*w == 1);
  op.mask = t({4, 49, 49});
  w = score_terms_check(op, d, DType::bf16, false);
  REQUIRE(w.ok());
  CHECK(*w == 4);
  op.mask = t({3, 49, 49});  // 3 windows do not divide a batch of 8
  CHECK_THAT(score_terms_check(op, d, DType::f32, false).error().message(), Catch::Contains("W dividing"));
  op.mask = t({4, 49, 48});
  CHECK_FALSE(score_terms_check(op, d, DType::f32, false).ok());
  op.mask = t({4, 49, 49}, DType::bf16);  // masks are f32
  CHECK_FALSE(score_terms_check(op, d, DType::bf16, false).ok());
  op.mask = Tensor();
  op.bias = t({49, 49, 3}, DType::bf16);
  CHECK(score_terms_check(op, d, DType::bf16, false).ok());
  CHECK_FALSE(score_terms_check(op, d, DType::f16, false).ok());  // neither f32 nor qkv's dtype
  op.bias = t({49, 49, 3});
  CHECK(score_terms_check(op, d, DType::f16, false).ok());
  auto no_dbias = score_terms_check(op, d, DType::f32, true);
  REQUIRE_FALSE(no_dbias.ok());
  CHECK_THAT(no_dbias.error().message(), Catch::Contains("dbias"));
  op.dbias = t({49, 49, 3}, DType::bf16);  // a parameter gradient: f32
  CHECK_FALSE(score_terms_check(op, d, DType::bf16, true).ok());
  op.dbias = t({49, 49, 2});
  CHECK_FALSE(score_terms_check(op, d, DType::f32, true).ok());
  op.dbias = t({49, 49, 3});
  CHECK(score_terms_check(op, d, DType::f32, true).ok());
  op.bias = t({49, 49, 4});
  CHECK_FALSE(score_terms_check(op, d, DType::f32, true).ok());
}

TEST_CASE("row views, element counts, rope shapes") {
  CHECK(*rows_of(t({6, 4}), 4) == 6);
  CHECK(*rows_of(t({2, 3, 4}), 4) == 6);
  CHECK_FALSE(rows_of(t({6, 4}), 5).ok());
  CHECK_FALSE(rows_of(t({6, 4}), 0).ok());
  CHECK(expect_numel(t({6, 4}), 24, "x").ok());
  CHECK_FALSE(expect_numel(t({6, 4}), 23, "x").ok());
  CHECK_FALSE(expect_dtype(t({2}), DType::i32, "ids").ok());
  CHECK(rope_check(t({2, 8, 6, 16}), 6, 4).ok());
  CHECK_FALSE(rope_check(t({2, 8, 6, 15}), 6, 4).ok());
  CHECK_FALSE(rope_check(t({2, 8, 6, 16}), 6, 7).ok());
  CHECK_FALSE(rope_check(t({2, 8, 6, 16}), 5, 4).ok());
}

TEST_CASE("storage dtype: an op's activation tensors share one float dtype") {
  const Tensor x = t({4, 8}, DType::bf16), w = t({8}, DType::bf16), out = t({4, 8}, DType::bf16);
  auto d = storage_dtype({{"x", &x}, {"weight", &w}, {"out", &out}});
  REQUIRE(d.ok());
  CHECK(*d == DType::bf16);
  const Tensor h = t({4, 8}, DType::f16), f = t({4, 8});
  CHECK(*storage_dtype({{"x", &h}}) == DType::f16);
  CHECK(*storage_dtype({{"x", &f}, {"out", &f}}) == DType::f32);
  // A bf16 input with an fp32 output is not one storage type: the message names both.
  auto mixed = storage_dtype({{"x", &x}, {"out", &f}});
  REQUIRE_FALSE(mixed.ok());
  CHECK_THAT(mixed.error().message(), Catch::Contains("x (4, 8) is bf16") &&
                                          Catch::Contains("out (4, 8) is fp32"));
  const Tensor ids = t({4}, DType::i32);
  auto not_float = storage_dtype({{"logits", &ids}});
  REQUIRE_FALSE(not_float.ok());
  CHECK_THAT(not_float.error().message(), Catch::Contains("logits (4) is int32"));
  CHECK(kernel_dtype(DType::bf16) == 1);
}
