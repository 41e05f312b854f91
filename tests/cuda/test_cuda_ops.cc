// Every op of the cuda backend against the cpu reference on the same inputs.
// Without a CUDA device each test prints "SKIPPED: no CUDA device" (ctest: Skipped);
// with one, it checks values: fp32 within 1e-5 (normwise relative), bf16 looser.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;
using cuda::CudaBackend;

TEST_CASE("cuda: transfers, fill, copy and cast match the cpu backend bit for bit") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const Vec x = random(1000, 1, 3.f);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    auto run = [&](Backend& b) {
      Tensor t = up(b, {1000}, x, d);
      Tensor f = b.empty({1000}, DType::f32);
      b.cast(t, f);
      Tensor c = b.empty({1000}, d);
      b.copy(t, c);
      Vec out = down(b, c);
      Vec back = down(b, f);
      out.insert(out.end(), back.begin(), back.end());
      Tensor filled = b.empty({7}, d);
      b.fill(filled, 1.1f);
      Vec fv = down(b, filled);
      out.insert(out.end(), fv.begin(), fv.end());
      return out;
    };
    CHECK(run(gpu) == run(cpu));
  }
  auto ids = [&](Backend& b) {
    Tensor t = up_ids(b, {5}, {0, -3, 7, 1 << 20, 42});
    return down(b, t);
  };
  CHECK(ids(gpu) == ids(cpu));
}

TEST_CASE("cuda: elementwise ops and deterministic reductions") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::size_t n = 100003;
  const Vec a = random(n, 2), b2 = random(n, 3);
  auto run = [&](Backend& b) {
    Tensor ta = up(b, {static_cast<std::int64_t>(n)}, a), tb = up(b, {static_cast<std::int64_t>(n)}, b2);
    Tensor o = b.empty({static_cast<std::int64_t>(n)});
    b.add(ta, tb, o);
    b.scale(o, 0.5f);
    b.axpy(-2.f, ta, o);
    Tensor s = b.empty({1}), q = b.empty({1});
    b.sum(o, s, 0.25f, false);
    b.sum(ta, s, 1.f, true);
    b.sum_squares(o, q, false);
    b.sum_squares(tb, q, true);
    Vec out = down(b, o);
    out.push_back(down(b, s)[0]);
    out.push_back(down(b, q)[0]);
    return out;
  };
  const Vec g = run(gpu), c = run(cpu);
  expect_close(g, c, kF32, "add/scale/axpy/sum/sum_squares");
  CHECK(run(gpu) == g);  // same bits on a second run
}

TEST_CASE("cuda: gemm, every transpose, bias and beta, fp32 and bf16") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t m = 67, n = 45, k = 129;
  const Vec a = random(m * k, 4), b = random(k * n, 5), c0 = random(m * n, 6), bias = random(n, 7);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        // C = 0.75 · op(A) · op(B) + 0.5 · C0 (+ bias), A and B of values av and bv stored in `in`.
        auto gemm = [&](Backend& be, const Vec& av, const Vec& bv, DType in) {
          Tensor A = up(be, ta ? Shape{k, m} : Shape{m, k}, av, in);
          Tensor B = up(be, tb ? Shape{n, k} : Shape{k, n}, bv, in);
          Tensor C = up(be, {m, n}, c0);
          GemmOp op;
          op.trans_a = ta;
          op.trans_b = tb;
          op.alpha = 0.75f;
          op.beta = 0.5f;
          if (with_bias) op.bias = up(be, {n}, bias);
          be.gemm(A, B, C, op);
          return down(be, C);
        };
        const std::string what = "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                 " bias=" + std::to_string(with_bias);
        expect_close(gemm(gpu, a, b, DType::f32), gemm(cpu, a, b, DType::f32), kF32, what);
        // bf16 inputs, fp32 accumulation: against fp32 math on the rounded inputs.
        expect_close(gemm(gpu, a, b, DType::bf16), gemm(cpu, bf16_round(a), bf16_round(b), DType::f32), 1e-5,
                     what + " bf16");
      }
}

TEST_CASE("cuda: batched gemm and bias backward") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t L = 3, m = 17, n = 33, k = 20;
  const Vec a = random(L * m * k, 8), b = random(L * k * n, 9), dy = random(1000 * n, 10);
  auto run = [&](Backend& be) {
    Tensor A = up(be, {L, k, m}, a), B = up(be, {L, k, n}, b), C = be.empty({L, m, n});
    GemmOp op;
    op.trans_a = true;
    be.batched_gemm(A, B, C, op);
    Tensor DY = up(be, {1000, n}, dy), db = up(be, {n}, Vec(static_cast<std::size_t>(n), 1.f));
    be.bias_backward(DY, db);
    return down_all(be, {&C, &db});
  };
  expect_close(run(gpu), run(cpu), kF32, "batched gemm + bias_backward");
}

TEST_CASE("cuda: embedding forward and deterministic backward with a vocab shard") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t V = 50, C = 300, N = 700, offset = 25;
  const std::vector<std::int32_t> ids = random_ids(N, 11, 90);  // some outside the shard
  const Vec table = random(V * C, 12), dout = random(N * C, 13);
  auto run = [&](Backend& b) {
    Tensor T = up(b, {V, C}, table), I = up_ids(b, {N}, ids), O = b.empty({N, C});
    b.embedding_forward(T, I, O, offset);
    Tensor D = up(b, {N, C}, dout), dT = up(b, {V, C}, table);
    b.embedding_backward(D, I, dT, offset);
    return down_all(b, {&O, &dT});
  };
  expect_close_and_repeatable(gpu, cpu, run, kF32, "embedding");
}

// A vocabulary shard of gpt2's size and a skewed id stream: one id takes half
// the tokens (a run far longer than a block), a few hundred ids the rest,
// some outside the shard; rows nobody uses must keep their values.
TEST_CASE("cuda: embedding backward with many repeated ids and a large vocabulary") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t V = 49257, C = 96, N = 16384, offset = 1000;
  const std::vector<std::int32_t> ids =
      random_ids(N, 29, [](std::mt19937& rng) { return rng() % 2 == 0 ? 1198 : rng() % 400 * 125; });
  const Vec dout = random(N * C, 30), grad0 = random(V * C, 31);
  auto run = [&](Backend& b) {
    Tensor I = up_ids(b, {N}, ids), D = up(b, {N, C}, dout), dT = up(b, {V, C}, grad0);
    b.embedding_backward(D, I, dT, offset);
    return down(b, dT);
  };
  expect_close_and_repeatable(gpu, cpu, run, kF32, "embedding backward, V=49257 N=16384");
}

TEST_CASE("cuda: layernorm and rmsnorm forward and backward") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 300, C = 200;
  const Vec x = random(N * C, 14, 2.f), w = random(C, 15), bias = random(C, 16), dout = random(N * C, 17);
  auto run = [&](Backend& b) {
    Tensor X = up(b, {N, C}, x), W = up(b, {C}, w), Bi = up(b, {C}, bias), D = up(b, {N, C}, dout);
    Tensor O = b.empty({N, C}), mean = b.empty({N}), rstd = b.empty({N}), dX = b.empty({N, C});
    Tensor dW = up(b, {C}, w), dB = up(b, {C}, bias);
    b.layernorm_forward(X, W, Bi, O, mean, rstd, 1e-5f);
    b.layernorm_backward(D, X, W, mean, rstd, dX, dW, dB);
    Tensor O2 = b.empty({N, C}), r2 = b.empty({N}), dX2 = b.empty({N, C}), dW2 = up(b, {C}, w);
    b.rmsnorm_forward(X, W, O2, r2, 1e-6f);
    b.rmsnorm_backward(D, X, W, r2, dX2, dW2);
    return down_all(b, {&O, &mean, &rstd, &dX, &dW, &dB, &O2, &r2, &dX2, &dW2});
  };
  expect_close_and_repeatable(gpu, cpu, run, kF32, "norms");
}

TEST_CASE("cuda: gelu, swiglu and counter-based dropout") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 64, F = 96;
  const Vec x = random(N * 2 * F, 18, 2.f), d = random(N * 2 * F, 19);
  auto run = [&](Backend& b) {
    Tensor X = up(b, {N, 2 * F}, x), D = up(b, {N, 2 * F}, d);
    Tensor g = b.empty({N, 2 * F}), dg = b.empty({N, 2 * F});
    b.gelu_forward(X, g);
    b.gelu_backward(D, X, dg);
    Tensor s = b.empty({N, F}), ds = b.empty({N, 2 * F});
    b.swiglu_forward(X, s);
    b.swiglu_backward(D.slice(0, N * F, {N, F}), X, ds);
    Tensor dr = b.empty({N, 2 * F}), bdr = b.empty({N, 2 * F});
    const DropoutOp op{0.3f, 1234, 777};
    b.dropout_forward(X, dr, op);
    b.dropout_backward(D, bdr, op);
    return down_all(b, {&g, &dg, &s, &ds, &dr, &bdr});
  };
  const Vec g = run(gpu), c = run(cpu);
  expect_close(g, c, kF32, "activations and dropout");
  // The same dropout mask: zeros exactly where the cpu's are, in the two
  // dropout outputs only (the last 2·N·2F values). A GELU of a very negative
  // x is 0 or a denormal-sized value depending on whether tanh rounds to -1,
  // which the gpu's tanhf and the cpu's tanh need not agree on.
  for (std::size_t i = g.size() - static_cast<std::size_t>(2 * N * 2 * F); i < g.size(); ++i)
    CHECK((c[i] == 0.f) == (g[i] == 0.f));
}

TEST_CASE("cuda: rope and its inverse") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t B = 2, T = 50, Ht = 6, D = 32;
  const Vec x = random(B * T * Ht * D, 20);
  auto run = [&](Backend& b) {
    Tensor X = up(b, {B, T, Ht, D}, x);
    b.rope(X, Ht, 4, 10000.f, false, 0);
    Vec fwd = down(b, X);
    b.rope(X, Ht, 4, 10000.f, true, 0);
    Vec back = down(b, X);
    fwd.insert(fwd.end(), back.begin(), back.end());
    // A chunk of a longer sequence (context parallelism) rotates from its first position.
    b.rope(X, Ht, 4, 10000.f, false, 777);
    Vec chunk = down(b, X);
    fwd.insert(fwd.end(), chunk.begin(), chunk.end());
    return fwd;
  };
  expect_close(run(gpu), run(cpu), kF32, "rope");
}

namespace {

// attention_forward then attention_backward of `op` on qkv (B, T, H + 2G, D)
// and dout (B, rows, H, D) in storage `dt`: out, lse and dqkv, concatenated.
Vec attention_outputs(Backend& b, DType dt, const AttentionOp& op, std::int64_t B, std::int64_t T,
                      const Vec& qkv, const Vec& dout) {
  const std::int64_t H = op.heads, W = op.heads + 2 * op.kv_heads, D = op.head_dim, R = op.window_rows(T);
  Tensor QKV = up(b, {B, T, W, D}, qkv, dt), DO = up(b, {B, R, H, D}, dout, dt);
  Tensor O = b.empty({B, R, H, D}, dt), L = b.empty({B, H, R});
  Tensor dQKV = b.empty({B, T, W, D}, dt);
  b.attention_forward(QKV, O, L, op);
  b.attention_backward(DO, QKV, O, L, dQKV, op);
  return down_all(b, {&O, &L, &dQKV});
}

}  // namespace

// fp32 runs the CUDA-core kernels; bf16 with D = 64 or 128 the tensor-core
// ones: T not a multiple of their 64-row tiles, GQA, and gpt2-124m's shape
// (T = 1024, H = G = 12, D = 64) at B = 2.
TEST_CASE("cuda: flash attention forward and backward, causal GQA, fp32 and bf16") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  struct Case {
    std::int64_t B, T, H, G, D;
  };
  for (const Case& c : {Case{2, 37, 4, 2, 32}, Case{1, 70, 2, 2, 64}, Case{1, 33, 4, 1, 128},
                        Case{2, 100, 8, 2, 64}, Case{1, 100, 4, 2, 128}, Case{2, 1024, 12, 12, 64}}) {
    const std::int64_t W = c.H + 2 * c.G;
    const Vec qkv = random(c.B * c.T * W * c.D, 21 + c.D), dout = random(c.B * c.T * c.H * c.D, 22);
    const AttentionOp op = attention_op(c.H, c.G, c.D);
    auto run = [&](Backend& b, DType dt, const Vec& q, const Vec& d) {
      return attention_outputs(b, dt, op, c.B, c.T, q, d);
    };
    const std::string what = "attention D=" + std::to_string(c.D) + " T=" + std::to_string(c.T);
    const Vec g = run(gpu, DType::f32, qkv, dout);
    expect_close(g, run(cpu, DType::f32, qkv, dout), kF32, what);
    CHECK(run(gpu, DType::f32, qkv, dout) == g);
    // bf16 storage: against fp32 math on the rounded inputs; outputs are rounded to bf16.
    const Vec gb = run(gpu, DType::bf16, qkv, dout);
    expect_close(gb, run(cpu, DType::f32, bf16_round(qkv), bf16_round(dout)), 2e-2, what + " bf16");
    CHECK(run(gpu, DType::bf16, qkv, dout) == gb);
  }
}

// Context parallelism's query windows (AttentionOp::query_begin/query_rows):
// the window's rows of out and lse, and dqkv with zero query rows outside the
// window, against the cpu kernel; causal and not, GQA, windows at the start,
// inside (not tile-aligned) and at the end, fp32 and bf16 (which a window
// keeps on the CUDA-core kernels).
TEST_CASE("cuda: attention over a query window, forward and backward") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  struct Case {
    std::int64_t B, T, H, G, D, q0, Q;
    bool causal;
  };
  for (const Case& c : {Case{2, 70, 4, 2, 32, 0, 35, true}, Case{2, 70, 4, 2, 32, 35, 35, true},
                        Case{1, 70, 2, 2, 64, 17, 21, true}, Case{1, 64, 4, 1, 128, 5, 40, false},
                        Case{2, 48, 2, 1, 64, 40, 8, false}}) {
    const std::int64_t W = c.H + 2 * c.G;
    const Vec qkv = random(c.B * c.T * W * c.D, 31 + c.D), dout = random(c.B * c.Q * c.H * c.D, 32);
    AttentionOp op = attention_op(c.H, c.G, c.D);
    op.causal = c.causal;
    op.query_begin = c.q0;
    op.query_rows = c.Q;
    auto run = [&](Backend& b, DType dt, const Vec& q, const Vec& d) {
      return attention_outputs(b, dt, op, c.B, c.T, q, d);
    };
    const std::string what = "window [" + std::to_string(c.q0) + ", " + std::to_string(c.q0 + c.Q) + ") of " +
                             std::to_string(c.T) + (c.causal ? " causal" : " bidirectional");
    const Vec g = run(gpu, DType::f32, qkv, dout);
    expect_close(g, run(cpu, DType::f32, qkv, dout), kF32, what);
    CHECK(run(gpu, DType::f32, qkv, dout) == g);
    const Vec gb = run(gpu, DType::bf16, qkv, dout);
    expect_close(gb, run(cpu, DType::f32, bf16_round(qkv), bf16_round(dout)), 2e-2, what + " bf16");
  }
}

TEST_CASE("cuda: vocab-parallel cross-entropy phases") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 40, V = 1000, offset = 500;
  const Vec logits = random(N * V, 23, 3.f);
  const std::vector<std::int32_t> targets = cross_entropy_targets(N);
  auto run = [&](Backend& b) {
    Tensor Lg = up(b, {N, V}, logits), Tg = up_ids(b, {N}, targets);
    CrossEntropyRun ce = cross_entropy_phases(b, Lg, Tg, N, V, offset);
    return down_all(b, {&ce.max, &ce.sums, &ce.target_logits, &ce.loss, &ce.dlogits});
  };
  expect_close(run(gpu), run(cpu), kF32, "cross-entropy");
}

TEST_CASE("cuda: clip coefficient and AdamW") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t n = 5000;
  const Vec p = random(n, 24), g = random(n, 25), m = random(n, 26, 0.1f);
  const Vec v = random_second_moment(n, 27);
  auto run = [&](Backend& b) {
    Tensor P = up(b, {n}, p), G = up(b, {n}, g), M = up(b, {n}, m), Vv = up(b, {n}, v);
    Tensor ss = b.empty({1}), coef = b.empty({1});
    b.sum_squares(G, ss, false);
    b.clip_coefficient(ss, 1.0f, coef);
    AdamWOp op;
    op.lr = 1e-3f;
    op.weight_decay = 0.1f;
    op.step = 3;
    b.adamw(P, G, M, Vv, coef, op);
    b.adamw(P, G, M, Vv, Tensor(), op);
    return down_all(b, {&P, &M, &Vv, &coef});
  };
  expect_close(run(gpu), run(cpu), kF32, "clip + adamw");
}

TEST_CASE("cuda: streams and events order work, the allocator stops growing after warm-up") {
  MT_GPU_OR_SKIP(gpu);
  const Stream side = gpu.create_stream("side");
  const Vec x = random(1 << 20, 28);
  auto step = [&] {
    Tensor a = up(gpu, {1 << 20}, x);
    Event written = gpu.record(gpu.current_stream());
    Tensor b = gpu.empty({1 << 20});
    {
      StreamScope scope(gpu, side);
      gpu.wait(side, written);
      gpu.copy(a, b);
      gpu.scale(b, 2.f);
    }
    gpu.wait(Stream{0}, gpu.record(side));
    Tensor s = gpu.empty({1});
    gpu.sum(b, s, 1.f, false);
    return down(gpu, s)[0];
  };
  const float first = step();
  REQUIRE(gpu.synchronize().ok());
  const auto warm = gpu.allocator_stats().raw_allocations;
  for (int i = 0; i < 5; ++i) CHECK(step() == first);
  REQUIRE(gpu.synchronize().ok());
  CHECK(gpu.allocator_stats().raw_allocations == warm);
  double ref = 0;
  for (float v : x) ref += 2.0 * v;
  CHECK(first == Approx(ref).margin(1e-2));
}
