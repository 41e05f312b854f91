// The tiny models' first training steps on the cuda backend against the cpu
// reference on the same seed and data (tests/parallel's harness): fp32 within
// 1e-4 of the cpu losses, bf16 mixed precision (16-bit activations and working
// weights, fp32 masters, gradients and AdamW state) within 2%. Gpt covers
// layernorm, gelu, learned positions, biases and the tied head; llama
// rmsnorm, swiglu, rope, grouped-query attention and an untied head; vit-tiny
// bidirectional attention, the patch embedding and class token, the
// classifier; swin-micro window attention with its relative position bias and
// shifted-window mask, patch merging over an odd grid and mean pooling.
// Without a device the test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include "tests/cuda/cuda_test_util.h"
#include "tests/parallel/parallel_harness.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

constexpr int kTrainSteps = 2;

// Mean loss (per token, or per image) of each of the first kTrainSteps steps on one rank.
std::vector<double> losses(Backend& b, const ModelSpec& m, Precision precision) {
  Plan p = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  p.precision = precision;
  if (m.vision()) p.seq_len = 0;  // the images fix the tokens
  TrainingEngine engine(b, m, p, step_options());
  std::vector<double> out;
  for (int s = 1; s <= kTrainSteps; ++s) {
    auto r = engine.step(global_batch(m, s), 1e-2f, s);
    INFO(m.name << " " << precision_name(precision) << " on " << b.name() << " step " << s);
    REQUIRE(r.ok());
    out.push_back(r->loss);
  }
  return out;
}

}  // namespace

TEST_CASE("cuda: the tiny models' first steps, fp32 and bf16 on the gpu against fp32 on the cpu") {
  MT_GPU_OR_SKIP(gpu);
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (const ModelSpec& m : {tiny_gpt(), tiny_llama(), *model_preset("vit-tiny"), *model_preset("swin-micro")}) {
    CpuBackend cpu;
    const std::vector<double> ref = losses(cpu, m, Precision::fp32);
    const std::vector<double> f32 = losses(gpu, m, Precision::fp32);
    const std::vector<double> bf16 = losses(gpu, m, Precision::bf16);
    for (int s = 0; s < kTrainSteps; ++s) {
      INFO(m.name << " step " << s + 1 << ": cpu fp32 " << ref[s] << ", cuda fp32 " << f32[s]
                  << ", cuda bf16 " << bf16[s]);
      CHECK(std::abs(f32[s] - ref[s]) <= 1e-4);
      CHECK(std::abs(bf16[s] - ref[s]) <= 0.02 * std::abs(ref[s]));
    }
  }
}
