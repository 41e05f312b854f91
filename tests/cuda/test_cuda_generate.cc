// `meshtrain generate` on cuda: the same KV-cache decoding (models/cached_decoder.h,
// engine/generate/generation.h) on the cuda backend as on the cpu reference,
// for GPT and Llama-with-experts tiny models: the prefill's logits agree to
// fp32 accuracy and greedy decoding picks the same tokens.
#include <catch2/catch.hpp>

#include "backends/cpu/cpu_backend.h"
#include "engine/generate/generation.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

ModelSpec llama_moe() {
  ModelSpec m = meshtrain::testing::llama_layers({});
  m.name = "llama-moe-test";
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 32, m.vocab = 96, m.seq_len = 48;
  m.experts = 4, m.top_k = 2, m.dense_layers = 1, m.dense_ffn = 96;
  return m;
}

void check_same_generation(Backend& gpu, const ModelSpec& m) {
  CpuBackend cpu;
  CachedDecoder on_cpu(cpu, m, m.seq_len), on_gpu(gpu, m, m.seq_len);
  // Counter-based initialisation: both backends draw the same fp32 parameters.
  on_cpu.parameters().initialize(17);
  on_gpu.parameters().initialize(17);
  const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 26, 5, 35};
  const Vec want = down(cpu, on_cpu.forward(prompt, true)), got = down(gpu, on_gpu.forward(prompt, true));
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  INFO(m.name << ": prefill logits differ by " << worst << " (largest " << scale << ")");
  CHECK(worst <= 1e-3 * scale + 1e-5);
  GenerationOptions o;
  o.max_new_tokens = 24;
  o.sampling.temperature = 0;
  auto a = generate_tokens(on_cpu, prompt, o), b = generate_tokens(on_gpu, prompt, o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->tokens == a->tokens);
  CHECK(b->stop == StopReason::max_new_tokens);
}

}  // namespace

TEST_CASE("cuda generate equals cpu generate (greedy, KV cache)", "[cuda][generate]") {
  MT_GPU_OR_SKIP(gpu);
  ModelSpec tiny = *model_preset("tiny");
  check_same_generation(gpu, tiny);
  check_same_generation(gpu, llama_moe());
}
