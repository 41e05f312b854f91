// The cuda ops in 16-bit storage (bf16 and fp16), as models/gpt.cc issues
// them under mixed precision, against the cpu backend computing the same math
// in fp32 on the same rounded inputs. The only expected difference is the
// rounding of 16-bit outputs on store: they must agree within a few units of
// roundoff (normwise); fp32 outputs computed from 16-bit inputs (statistics,
// parameter gradients, sums) within 1e-5, which fails if anything
// accumulates in 16 bits. Reductions must give the same bits twice.
// Without a device each test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

constexpr DType kHalves[] = {DType::bf16, DType::f16};

// Four units of roundoff of dtype d: bf16 keeps 8 significant bits, fp16 11.
double store_tol(DType d) { return d == DType::bf16 ? 4 * 0x1p-9 : 4 * 0x1p-11; }

// An op's results: those stored in its storage dtype, and its fp32 ones.
struct Out {
  Vec stored, wide;
  bool operator==(const Out&) const = default;
};

// The gpu ran with storage d, the cpu in fp32 on inputs rounded to d.
void compare(const Out& gpu, const Out& cpu, DType d, const std::string& what) {
  const std::string name = what + " " + std::string(dtype_name(d));
  expect_close(gpu.stored, cpu.stored, store_tol(d), name + " (16-bit outputs)");
  if (!cpu.wide.empty()) expect_close(gpu.wide, cpu.wide, kF32, name + " (fp32 outputs)");
}

enum class Repeatable { no, yes };

// For each 16-bit dtype d: run(gpu, d, inputs...) against run(cpu, fp32, the
// inputs rounded to d) (compare); where repeatable, a second gpu run gives
// the same bits.
template <class Run, class... Inputs>
void compare_halves(Backend& gpu, Backend& cpu, const std::string& what, Repeatable repeatable, Run&& run,
                    const Inputs&... inputs) {
  for (DType d : kHalves) {
    const Out g = run(gpu, d, inputs...);
    compare(g, run(cpu, DType::f32, round_to(inputs, d)...), d, what);
    if (repeatable == Repeatable::yes) CHECK(run(gpu, d, inputs...) == g);
  }
}

}  // namespace

TEST_CASE("cuda 16-bit: add, scale, axpy, sum and sum_squares") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t n = 100003;
  const Vec a = random(n, 101), b = random(n, 102);
  for (DType d : kHalves) {
    auto run = [&](Backend& be, DType dt, const Vec& av, const Vec& bv) {
      Tensor A = up(be, {n}, av, dt), B = up(be, {n}, bv, dt), O = be.empty({n}, dt);
      be.add(A, B, O);
      Tensor S = up(be, {n}, av, dt), Y = up(be, {n}, bv, dt);
      be.scale(S, 0.5f);
      be.axpy(-2.f, A, Y);
      // The reference (fp32 storage) rounds Y as the gpu stores it, so that
      // the sum below reads the same values: unrounded, the 1e5 rounding
      // errors of up to 2^-9 relative add up to ~1e-5 of the result.
      if (dt == DType::f32) be.write(Y, round_to(down(be, Y), d));
      be.add(B, A, B);  // out aliasing an input, as the engine's x += pe
      Tensor s = be.empty({1}), q = be.empty({1});
      be.sum(A, s, 0.25f, false);
      be.sum(Y, s, 1.f, true);
      be.sum_squares(A, q, false);
      be.sum_squares(S, q, true);
      return Out{down_all(be, {&O, &S, &Y, &B}), down_all(be, {&s, &q})};
    };
    const Out g = run(gpu, d, a, b);
    compare(g, run(cpu, DType::f32, round_to(a, d), round_to(b, d)), d, "add/scale/axpy/sum");
    CHECK(run(gpu, d, a, b) == g);
  }
}

TEST_CASE("cuda 16-bit: GEMMs as the engine issues them (16-bit output with bias, fp32 weight gradient)") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t rows = 96, in = 72, out = 136;
  const Vec x = random(rows * in, 103), w = random(in * out, 104, 0.1f), bias = random(out, 105);
  const Vec dy = random(rows * out, 106), dw0 = random(in * out, 107);
  auto run = [&](Backend& be, DType dt, const Vec& xv, const Vec& wv, const Vec& bv, const Vec& dyv) {
    Tensor X = up(be, {rows, in}, xv, dt), W = up(be, {in, out}, wv, dt);
    Tensor DY = up(be, {rows, out}, dyv, dt);
    GemmOp forward;
    forward.bias = up(be, {out}, bv, dt);
    Tensor Y = be.empty({rows, out}, dt);
    be.gemm(X, W, Y, forward);  // linear: y = x w + b
    GemmOp input_grad, weight_grad;
    input_grad.trans_b = true;
    weight_grad.trans_a = true;
    weight_grad.beta = 1.f;
    Tensor DX = be.empty({rows, in}, dt);
    be.gemm(DY, W, DX, input_grad);   // dx = dy wᵀ
    Tensor DW = up(be, {in, out}, dw0);  // the fp32 gradient, accumulated
    be.gemm(X, DY, DW, weight_grad);  // dw += xᵀ dy
    return Out{down_all(be, {&Y, &DX}), down(be, DW)};
  };
  compare_halves(gpu, cpu, "gemm", Repeatable::no, run, x, w, bias, dy);
}

TEST_CASE("cuda 16-bit: bias_backward and embedding forward/backward into fp32 gradients, deterministic") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t V = 50, C = 300, N = 700, offset = 25;
  const std::vector<std::int32_t> ids = random_ids(N, 108, 90);  // some outside the shard
  const Vec table = random(V * C, 109), dout = random(N * C, 110), grad0 = random(V * C, 111);
  auto run = [&](Backend& be, DType dt, const Vec& tv, const Vec& dv) {
    Tensor T = up(be, {V, C}, tv, dt), I = up_ids(be, {N}, ids), O = be.empty({N, C}, dt);
    be.embedding_forward(T, I, O, offset);
    Tensor D = up(be, {N, C}, dv, dt), dT = up(be, {V, C}, grad0);
    be.embedding_backward(D, I, dT, offset);
    Tensor db = up(be, {C}, Vec(grad0.begin(), grad0.begin() + C));
    be.bias_backward(D, db);
    return Out{down(be, O), down_all(be, {&dT, &db})};
  };
  compare_halves(gpu, cpu, "embedding + bias_backward", Repeatable::yes, run, table, dout);
}

TEST_CASE("cuda 16-bit: layernorm and rmsnorm (16-bit rows and weights, fp32 statistics and gradients)") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 300, C = 200;
  const Vec x = random(N * C, 112, 2.f), w = random(C, 113), bias = random(C, 114);
  const Vec dout = random(N * C, 115), g0 = random(C, 116);
  auto run = [&](Backend& be, DType dt, const Vec& xv, const Vec& wv, const Vec& bv, const Vec& dv) {
    Tensor X = up(be, {N, C}, xv, dt), W = up(be, {C}, wv, dt), Bi = up(be, {C}, bv, dt);
    Tensor D = up(be, {N, C}, dv, dt);
    Tensor O = be.empty({N, C}, dt), mean = be.empty({N}), rstd = be.empty({N});
    Tensor dX = be.empty({N, C}, dt), dW = up(be, {C}, g0), dB = up(be, {C}, g0);
    be.layernorm_forward(X, W, Bi, O, mean, rstd, 1e-5f);
    be.layernorm_backward(D, X, W, mean, rstd, dX, dW, dB);
    Tensor O2 = be.empty({N, C}, dt), r2 = be.empty({N}), dX2 = be.empty({N, C}, dt);
    Tensor dW2 = up(be, {C}, g0);
    be.rmsnorm_forward(X, W, O2, r2, 1e-6f);
    be.rmsnorm_backward(D, X, W, r2, dX2, dW2);
    return Out{down_all(be, {&O, &dX, &O2, &dX2}), down_all(be, {&mean, &rstd, &dW, &dB, &r2, &dW2})};
  };
  compare_halves(gpu, cpu, "norms", Repeatable::yes, run, x, w, bias, dout);
}

TEST_CASE("cuda 16-bit: gelu, swiglu and counter-based dropout (in place too)") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 64, F = 96;
  const Vec x = random(N * 2 * F, 117, 2.f), dv = random(N * 2 * F, 118);
  for (DType d : kHalves) {
    auto run = [&](Backend& be, DType dt, const Vec& xv, const Vec& dvv) {
      Tensor X = up(be, {N, 2 * F}, xv, dt), D = up(be, {N, 2 * F}, dvv, dt);
      Tensor g = be.empty({N, 2 * F}, dt), dg = be.empty({N, 2 * F}, dt);
      be.gelu_forward(X, g);
      be.gelu_backward(D, X, dg);
      Tensor s = be.empty({N, F}, dt), ds = be.empty({N, 2 * F}, dt);
      be.swiglu_forward(X, s);
      be.swiglu_backward(D.slice(0, N * F, {N, F}), X, ds);
      const DropoutOp op{0.3f, 1234, 777};
      Tensor dr = up(be, {N, 2 * F}, xv, dt), bdr = be.empty({N, 2 * F}, dt);
      be.dropout_forward(dr, dr, op);  // in place, as the engine drops out its projections
      be.dropout_backward(D, bdr, op);
      return Out{down_all(be, {&g, &dg, &s, &ds, &dr, &bdr}), {}};
    };
    const Out g = run(gpu, d, x, dv), c = run(cpu, DType::f32, round_to(x, d), round_to(dv, d));
    compare(g, c, d, "activations and dropout");
    // The same dropout mask, in the two dropout outputs (the last 2·N·2F
    // values) only: a GELU of a very negative x is 0 or tiny depending on
    // whether tanh rounds to -1, where the gpu's tanhf and the cpu's tanh
    // may differ.
    for (std::size_t i = g.stored.size() - static_cast<std::size_t>(2 * N * 2 * F); i < g.stored.size(); ++i)
      CHECK((c.stored[i] == 0.f) == (g.stored[i] == 0.f));
  }
}

TEST_CASE("cuda 16-bit: rope and its inverse") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t B = 2, T = 50, Ht = 6, D = 32;
  const Vec x = random(B * T * Ht * D, 119);
  auto run = [&](Backend& be, DType dt, const Vec& xv) {
    Tensor X = up(be, {B, T, Ht, D}, xv, dt), Y = up(be, {B, T, Ht, D}, xv, dt);
    be.rope(X, Ht, 4, 10000.f, false, 0);
    be.rope(Y, Ht, 4, 10000.f, true, 0);
    return Out{down_all(be, {&X, &Y}), {}};
  };
  compare_halves(gpu, cpu, "rope", Repeatable::no, run, x);
}

// 16-bit storage with D = 64 or 128 runs the tensor-core kernels (which also
// round P and dS to 16 bits), other D and unaligned tensors the CUDA-core
// ones. Cases: T not a multiple of the 64-row tiles, T = 1024 with enough
// (b, h) to fill the device many times over, GQA with G < H, and a view one
// element into its buffer (not 16-byte aligned: the CUDA-core kernels).
TEST_CASE("cuda 16-bit: flash attention forward and backward in bf16 and fp16") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  struct Case {
    std::int64_t B, T, H, G, D, offset;
  };
  for (const Case& c : {Case{2, 37, 4, 2, 32, 0}, Case{2, 100, 4, 2, 64, 0}, Case{1, 100, 4, 1, 128, 0},
                        Case{2, 130, 3, 3, 128, 0}, Case{4, 1024, 8, 4, 64, 0},
                        Case{2, 1024, 4, 2, 128, 0}, Case{1, 100, 4, 2, 64, 1}}) {
    const std::int64_t W = c.H + 2 * c.G, n = c.B * c.T * W * c.D;
    const Vec qkv = random(n, 120 + c.T + c.D), dout = random(c.B * c.T * c.H * c.D, 121 + c.T);
    const AttentionOp op = attention_op(c.H, c.G, c.D);
    for (DType d : kHalves) {
      auto run = [&](Backend& be, DType dt, const Vec& q, const Vec& dv) {
        Vec padded(static_cast<std::size_t>(c.offset), 0.f);
        padded.insert(padded.end(), q.begin(), q.end());
        Tensor QKV = up(be, {c.offset + n}, padded, dt).slice(c.offset, n, {c.B, c.T, W, c.D});
        Tensor DO = up(be, {c.B, c.T, c.H, c.D}, dv, dt);
        Tensor O = be.empty({c.B, c.T, c.H, c.D}, dt), L = be.empty({c.B, c.H, c.T});
        Tensor dQKV = be.empty({c.B, c.T, W, c.D}, dt);
        be.attention_forward(QKV, O, L, op);
        be.attention_backward(DO, QKV, O, L, dQKV, op);
        return Out{down_all(be, {&O, &dQKV}), down(be, L)};
      };
      const std::string what = "attention B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                               " H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) +
                               " D=" + std::to_string(c.D) + " offset=" + std::to_string(c.offset) +
                               " " + std::string(dtype_name(d));
      const Out g = run(gpu, d, qkv, dout), r = run(cpu, DType::f32, round_to(qkv, d), round_to(dout, d));
      // Backward reads the 16-bit O that forward stored (the cpu its fp32 O), so
      // dQKV differs by more than one rounding: the looser bound of test_cuda_ops.
      expect_close(g.stored, r.stored, d == DType::bf16 ? 2e-2 : 5e-3, what);
      expect_close(g.wide, r.wide, kF32, what + " lse");
      CHECK(run(gpu, d, qkv, dout) == g);
    }
  }
}

TEST_CASE("cuda 16-bit: vocab-parallel cross-entropy (16-bit logits, fp32 statistics and losses)") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t N = 40, V = 1000, offset = 500;
  const Vec logits = random(N * V, 122, 3.f);
  const std::vector<std::int32_t> targets = cross_entropy_targets(N);
  auto run = [&](Backend& be, DType dt, const Vec& lv) {
    Tensor Lg = up(be, {N, V}, lv, dt), Tg = up_ids(be, {N}, targets);
    CrossEntropyRun ce = cross_entropy_phases(be, Lg, Tg, N, V, offset);
    Tensor total = be.empty({1});
    be.sum(ce.loss, total, 1.f, false);
    return Out{down(be, ce.dlogits), down_all(be, {&ce.max, &ce.sums, &ce.target_logits, &ce.loss, &total})};
  };
  compare_halves(gpu, cpu, "cross-entropy", Repeatable::yes, run, logits);
}
