// The mixture-of-experts ops, cuda against the cpu reference: the router
// (experts chosen identically, probabilities, lse and weights), its
// backward with the balance and z-loss terms, and the combine and its
// backward in fp32 and bf16 storage; plus a tiny MoE model's training steps
// under the engine. Without a CUDA device each test prints "SKIPPED: no CUDA
// device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/step/training_engine.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

constexpr std::int64_t N = 300, E = 16, K = 4, C = 96;

struct Routed {
  Vec probs, lse, weights, experts, dlogits;
};

Routed route(Backend& b, const Vec& logits, const Vec& dweights, const Vec& prob_grad, bool renormalize) {
  Tensor l = up(b, Shape{N, E}, logits), probs = b.empty(Shape{N, E}), lse = b.empty(Shape{N});
  Tensor w = b.empty(Shape{N, K}), experts = b.empty(Shape{N, K}, DType::i32), dl = b.empty(Shape{N, E});
  b.moe_route(l, renormalize, probs, lse, w, experts);
  b.moe_route_backward(up(b, Shape{N, K}, dweights), probs, lse, experts, up(b, Shape{E}, prob_grad), 0.25f,
                       renormalize, dl);
  return {down(b, probs), down(b, lse), down(b, w), down(b, experts), down(b, dl)};
}

}  // namespace

TEST_CASE("cuda moe_route and its backward match the cpu", "[cuda][gpu][moe]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const Vec logits = random(N * E, 41, 2.f), dweights = random(N * K, 42), prob_grad = random(E, 43, 0.1f);
  for (bool renormalize : {true, false}) {
    INFO("renormalize " << renormalize);
    const Routed want = route(cpu, logits, dweights, prob_grad, renormalize);
    const Routed got = route(gpu, logits, dweights, prob_grad, renormalize);
    CHECK(got.experts == want.experts);  // the same experts, in the same slots
    expect_close(got.probs, want.probs, kF32, "probs");
    expect_close(got.lse, want.lse, kF32, "lse");
    expect_close(got.weights, want.weights, kF32, "weights");
    expect_close(got.dlogits, want.dlogits, kF32, "dlogits");
  }
}

TEST_CASE("cuda moe_combine and its backward match the cpu in fp32 and bf16", "[cuda][gpu][moe]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t M = N * K;
  // A permutation of the slots' rows with every seventh slot dropped.
  std::vector<std::int32_t> index(static_cast<std::size_t>(N * K));
  for (std::int64_t i = 0; i < N * K; ++i)
    index[static_cast<std::size_t>(i)] = i % 7 == 3 ? -1 : static_cast<std::int32_t>((i * 37) % M);
  const Vec rows = random(M * C, 51), weights = random(N * K, 52), dout = random(N * C, 53);
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dt));
    // The reference computes in fp32 on the values the 16-bit tensors hold.
    const Vec rows_in = round_to(rows, dt), dout_in = round_to(dout, dt);
    Tensor r = up(cpu, Shape{M, C}, rows_in), out = cpu.empty(Shape{N, C}), dr = cpu.empty(Shape{M, C});
    Tensor idx = up_ids(cpu, Shape{N, K}, index), w = up(cpu, Shape{N, K}, weights), dw = cpu.empty(Shape{N, K});
    cpu.moe_combine(r, idx, w, out);
    cpu.moe_combine_backward(up(cpu, Shape{N, C}, dout_in), r, idx, w, dr, dw);
    Tensor gr = up(gpu, Shape{M, C}, rows_in, dt), gout = gpu.empty(Shape{N, C}, dt), gdr = gpu.empty(Shape{M, C}, dt);
    Tensor gidx = up_ids(gpu, Shape{N, K}, index), gw = up(gpu, Shape{N, K}, weights), gdw = gpu.empty(Shape{N, K});
    gpu.moe_combine(gr, gidx, gw, gout);
    gpu.moe_combine_backward(up(gpu, Shape{N, C}, dout_in, dt), gr, gidx, gw, gdr, gdw);
    const double tol = dt == DType::f32 ? kF32 : 1e-2;  // bf16 rounds the stored outputs
    expect_close(down(gpu, gout), down(cpu, out), tol, "out");
    expect_close(down(gpu, gdr), down(cpu, dr), tol, "drows");
    expect_close(down(gpu, gdw), down(cpu, dw), kF32, "dweights");
  }
}

TEST_CASE("a tiny MoE model's training steps on cuda match the cpu (fp32)", "[cuda][gpu][moe]") {
  MT_GPU_OR_SKIP(gpu);
  ModelSpec m = *model_preset("tiny-moe");
  m.capacity_factor = 1.25f;
  Plan p;
  p.micro_batch = 2, p.global_batch = 4, p.seq_len = 32, p.precision = Precision::fp32;
  REQUIRE(validate_plan(p, m).ok());
  StepOptions o;
  o.seed = 5;
  CpuBackend cpu;
  TrainingEngine on_cpu(cpu, m, p, o), on_gpu(gpu, m, p, o);
  for (int s = 1; s <= 3; ++s) {
    std::vector<HostBatch> batches;
    for (int j = 0; j < 2; ++j) {
      HostBatch h = example_batch(m, 2, 32);
      for (auto& id : h.ids) id = (id * (s + 3) + j) % 256;
      for (std::size_t i = 0; i < h.targets.size(); ++i) h.targets[i] = h.ids[(i + 1) % h.ids.size()];
      batches.push_back(h);
    }
    auto a = on_cpu.step(batches, 1e-3f, s), b = on_gpu.step(batches, 1e-3f, s);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(b->loss == Approx(a->loss).epsilon(1e-4));
    CHECK(b->grad_norm == Approx(a->grad_norm).epsilon(1e-3));
    // Routing may differ where two experts' logits tie to within rounding: compare the totals and the balance.
    REQUIRE(b->moe.tokens_per_expert.size() == a->moe.tokens_per_expert.size());
    for (std::size_t l = 0; l < a->moe.tokens_per_expert.size(); ++l) {
      double ta = 0, tb = 0;
      for (double t : a->moe.tokens_per_expert[l]) ta += t;
      for (double t : b->moe.tokens_per_expert[l]) tb += t;
      CHECK(tb == ta);
    }
    CHECK(b->moe.load_max_over_mean == Approx(a->moe.load_max_over_mean).epsilon(0.05));
    CHECK(b->moe.aux_loss == Approx(a->moe.aux_loss).epsilon(1e-3));
  }
}
