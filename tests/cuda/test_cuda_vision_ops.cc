// The ops the vision models add, cuda against the cpu reference: attention
// without the causal mask (ViT), with a relative position bias, a shifted-
// window mask and the bias gradient (Swin), grouped-query attention with a
// bias, gather_rows and cross_entropy_accuracy. Without a CUDA device each
// test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

// One attention problem: qkv (B, T, H + 2G, D); bias (T, T, H) when `bias`;
// mask (W, T, T) when windows > 0.
struct Attn {
  std::int64_t B, T, H, G, D;
  bool causal, bias;
  std::int64_t windows;

  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " G=" + std::to_string(G) + " D=" + std::to_string(D) + (causal ? " causal" : " full") +
           (bias ? " bias" : "") + (windows > 0 ? " mask W=" + std::to_string(windows) : "");
  }
};

struct AttnOut {
  Vec stored;  // O and dQKV, of the storage dtype
  Vec lse;
  Vec dbias;  // empty without a bias
  bool operator==(const AttnOut&) const = default;
};

struct AttnInputs {
  Vec qkv, dout, bias, mask;
};

// Swin's shifted-window mask on a 7 x 7 window: window w splits its columns
// (w odd) and rows (w >= 2) at 4 into regions; scores across regions get -100.
Vec window_mask(std::int64_t windows, std::int64_t T) {
  const std::int64_t side = 7;
  REQUIRE(T == side * side);
  auto region = [&](std::int64_t w, std::int64_t t) {
    return ((w % 2 == 1 && t % side >= 4) ? 1 : 0) + ((w % 4 >= 2 && t / side >= 4) ? 2 : 0);
  };
  Vec m(static_cast<std::size_t>(windows * T * T));
  for (std::int64_t w = 0; w < windows; ++w)
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t j = 0; j < T; ++j)
        m[static_cast<std::size_t>((w * T + i) * T + j)] = region(w, i) == region(w, j) ? 0.f : -100.f;
  return m;
}

AttnInputs inputs(const Attn& c, std::uint64_t seed) {
  AttnInputs in;
  in.qkv = random(c.B * c.T * (c.H + 2 * c.G) * c.D, seed);
  in.dout = random(c.B * c.T * c.H * c.D, seed + 1);
  if (c.bias) in.bias = random(c.T * c.T * c.H, seed + 2, 0.5f);
  if (c.windows > 0) in.mask = window_mask(c.windows, c.T);
  return in;
}

// Forward then backward; dt is the storage dtype of qkv, out, dout and dqkv,
// bias_dt the bias's. dbias starts as garbage: backward overwrites it.
AttnOut run_attention(Backend& be, const Attn& c, DType dt, DType bias_dt, const AttnInputs& in) {
  const std::int64_t W = c.H + 2 * c.G;
  AttentionOp op;
  op.heads = static_cast<int>(c.H);
  op.kv_heads = static_cast<int>(c.G);
  op.head_dim = static_cast<int>(c.D);
  op.scale = 1.f / std::sqrt(static_cast<float>(c.D));
  op.causal = c.causal;
  if (c.bias) {
    op.bias = up(be, {c.T, c.T, c.H}, in.bias, bias_dt);
    op.dbias = be.empty({c.T, c.T, c.H});
    be.fill(op.dbias, 7.f);
  }
  if (c.windows > 0) op.mask = up(be, {c.windows, c.T, c.T}, in.mask);
  Tensor QKV = up(be, {c.B, c.T, W, c.D}, in.qkv, dt), DO = up(be, {c.B, c.T, c.H, c.D}, in.dout, dt);
  Tensor O = be.empty({c.B, c.T, c.H, c.D}, dt), L = be.empty({c.B, c.H, c.T});
  Tensor dQKV = be.empty({c.B, c.T, W, c.D}, dt);
  be.attention_forward(QKV, O, L, op);
  be.attention_backward(DO, QKV, O, L, dQKV, op);
  return AttnOut{down_all(be, {&O, &dQKV}), down(be, L), c.bias ? down(be, op.dbias) : Vec{}};
}

// The cpu reference: fp32 math on the inputs as dtype dt (and the bias as
// bias_dt) holds them.
AttnOut reference(const Attn& c, DType dt, DType bias_dt, const AttnInputs& in) {
  CpuBackend cpu;
  AttnInputs r = in;
  r.qkv = round_to(in.qkv, dt);
  r.dout = round_to(in.dout, dt);
  r.bias = round_to(in.bias, bias_dt);
  return run_attention(cpu, c, DType::f32, DType::f32, r);
}

// Checks the gpu against the reference within tol (lse within 1e-5: it is
// fp32 math on the same rounded inputs whatever the storage) and that a
// second gpu run gives the same bits.
void check_attention(Backend& gpu, const Attn& c, DType dt, DType bias_dt, double tol,
                     std::uint64_t seed) {
  const AttnInputs in = inputs(c, seed);
  const std::string what = c.str() + " " + std::string(dtype_name(dt)) +
                           (c.bias ? " bias " + std::string(dtype_name(bias_dt)) : "");
  const AttnOut g = run_attention(gpu, c, dt, bias_dt, in), r = reference(c, dt, bias_dt, in);
  expect_close(g.stored, r.stored, tol, what + " O, dQKV");
  expect_close(g.lse, r.lse, dt == DType::f32 ? tol : kF32, what + " lse");
  if (c.bias) expect_close(g.dbias, r.dbias, tol, what + " dbias");
  CHECK(run_attention(gpu, c, dt, bias_dt, in) == g);
}

double tolerance(DType dt) { return dt == DType::f32 ? kF32 : dt == DType::bf16 ? 2e-2 : 5e-3; }

}  // namespace

// fp32 and D = 32 run the CUDA-core kernels; 16-bit storage with D = 64 or
// 128 the tensor-core ones, which read every key of a row when not causal.
// T = 197 is ViT-B/16's sequence (196 patches and the class token).
TEST_CASE("cuda: attention without the causal mask (ViT), fp32, bf16 and fp16") {
  MT_GPU_OR_SKIP(gpu);
  for (const Attn& c : {Attn{2, 37, 4, 2, 32, false, false, 0}, Attn{2, 197, 4, 4, 64, false, false, 0},
                        Attn{1, 100, 4, 1, 128, false, false, 0}, Attn{1, 130, 2, 2, 64, false, false, 0}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      check_attention(gpu, c, dt, dt, tolerance(dt), 300 + static_cast<std::uint64_t>(c.T));
}

// Swin's window attention: 8 windows of 7 x 7 tokens, 3 heads of 32 dims, a
// relative position bias shared by every window and 4 shifted-window masks
// (window b reads mask b mod 4). dbias sums the score gradients of the 8
// windows in order: the same bits on a second run.
TEST_CASE("cuda: attention with a bias, a window mask and the bias gradient (Swin)") {
  MT_GPU_OR_SKIP(gpu);
  const Attn c{8, 49, 3, 3, 32, false, true, 4};
  check_attention(gpu, c, DType::f32, DType::f32, 1e-4, 310);
  check_attention(gpu, c, DType::bf16, DType::bf16, 2e-2, 311);
  check_attention(gpu, c, DType::bf16, DType::f32, 2e-2, 312);  // an fp32 bias with bf16 activations
  check_attention(gpu, c, DType::f16, DType::f16, 5e-3, 313);
}

// Query heads sharing a kv head each have their own bias slice; causal with
// a bias (dbias zero above the diagonal), with and without a mask; a mask
// without a bias; and bf16 at D = 64, a shape the tensor-core kernels would
// take without the bias.
TEST_CASE("cuda: grouped-query attention with a bias, causal or not, and a mask alone") {
  MT_GPU_OR_SKIP(gpu);
  for (const Attn& c : {Attn{4, 40, 4, 2, 64, true, true, 0}, Attn{2, 49, 6, 2, 32, false, true, 2},
                        Attn{4, 49, 2, 2, 32, false, false, 4}, Attn{2, 70, 4, 1, 32, true, true, 0},
                        Attn{2, 49, 4, 1, 32, true, true, 2}}) {
    check_attention(gpu, c, DType::f32, DType::f32, 1e-4, 320 + c.T);
    check_attention(gpu, c, DType::bf16, DType::bf16, 2e-2, 330 + c.T);
  }
}

// Rows of 96 and of 7 elements (16-byte, 4-byte and 2-byte copies), a
// source view one element into its buffer (unaligned), negative indices
// (zero rows) and repeated ones. A gather copies bytes: exact.
TEST_CASE("cuda: gather_rows with negative indices, f32, bf16 and fp16") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t M = 50, N = 70;
  std::vector<std::int32_t> index(N);
  for (std::int64_t i = 0; i < N; ++i)
    index[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(i % 9 == 4 ? -1 : i % 13 == 0 ? -7 : (i * 17) % M);
  for (const std::int64_t X : {96, 7})
    for (const std::int64_t offset : {0, 1})
      for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
        const Vec src = random((M * X + offset), 340 + X);
        auto run = [&](Backend& be, DType d, const Vec& s) {
          Tensor S = up(be, {M * X + offset}, s, d).slice(offset, M * X, {M, X});
          Tensor I = up_ids(be, {N}, index), O = be.empty({N, X}, d);
          be.fill(O, 3.f);
          be.gather_rows(S, I, O);
          return down(be, O);
        };
        INFO("gather_rows X=" << X << " offset=" << offset << " " << dtype_name(dt));
        const Vec g = run(gpu, dt, src);
        CHECK(g == run(cpu, DType::f32, round_to(src, dt)));
        for (std::int64_t i = 0; i < N; ++i)
          if (index[static_cast<std::size_t>(i)] < 0)
            for (std::int64_t x = 0; x < X; ++x) CHECK(g[static_cast<std::size_t>(i * X + x)] == 0.f);
      }
}

// Rows where the target logit equals the row max (a hit), exceeds it (a
// shard's max combined before: still a hit) or falls below it; counted
// once, then accumulated onto the first count; a count past one block's
// threads.
TEST_CASE("cuda: cross_entropy_accuracy counts and accumulates exactly") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  for (const std::int64_t N : {1, 40, 3001}) {
    const Vec row_max = random(N, 350, 2.f);
    Vec target = row_max;
    for (std::int64_t i = 0; i < N; ++i) {
      auto& t = target[static_cast<std::size_t>(i)];
      t = i % 3 == 0 ? t : i % 3 == 1 ? t - 0.5f : std::nextafter(t, -INFINITY);
      if (i % 7 == 0) t += 0.25f;
    }
    auto run = [&](Backend& be) {
      Tensor M = up(be, {N}, row_max), Tl = up(be, {N}, target), once = be.empty({1}), twice = be.empty({1});
      be.fill(once, 5.f);
      be.cross_entropy_accuracy(M, Tl, once, false);
      be.fill(twice, 0.5f);
      be.cross_entropy_accuracy(M, Tl, twice, true);
      be.cross_entropy_accuracy(M, Tl, twice, true);
      return down_all(be, {&once, &twice});
    };
    const Vec g = run(gpu), c = run(cpu);
    INFO("N=" << N);
    CHECK(g == c);
    std::int64_t hits = 0;
    for (std::size_t i = 0; i < target.size(); ++i) hits += target[i] >= row_max[i] ? 1 : 0;
    CHECK(g[0] == static_cast<float>(hits));
    CHECK(g[1] == 0.5f + 2.f * static_cast<float>(hits));
  }
}
