// The KV cache of models/cached_decoder.h: decoding a sequence token by token
// over the cache gives, at every position, the logits of one forward over
// the whole sequence, for GPT (learned positions), Llama (RoPE, GQA,
// SwiGLU, RMSNorm) and mixture-of-experts models; and the decoder computes
// the training model's function: its logits give the loss ModelChunk
// computes on the same tokens.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "models/cached_decoder.h"
#include "models/model_chunk.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;

namespace {

ModelSpec gpt_spec() {
  ModelSpec m;
  m.name = "gpt-test";
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = 4, m.ffn = 64, m.vocab = 48, m.seq_len = 20;
  return m;
}

ModelSpec llama_spec() {
  ModelSpec m = testing::llama_layers({});
  m.name = "llama-test";
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = 2, m.ffn = 48, m.vocab = 48, m.seq_len = 20;
  m.norm_eps = 1e-6f, m.rope_theta = 500.f;
  return m;
}

// Llama-style MoE: a dense first layer, then experts with a shared one, a
// capacity factor that drops tokens in training (generation is dropless).
ModelSpec moe_spec() {
  ModelSpec m = llama_spec();
  m.name = "moe-test";
  m.layers = 3, m.experts = 4, m.top_k = 2, m.shared_experts = 1, m.dense_layers = 1, m.ffn = 16;
  m.dense_ffn = 40;
  return m;
}

std::vector<std::int32_t> sequence(int n, int vocab, std::uint32_t seed) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    ids.push_back(static_cast<std::int32_t>((seed >> 8) % static_cast<std::uint32_t>(vocab)));
  }
  return ids;
}

std::vector<float> read(Backend& b, const Tensor& t) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  REQUIRE(b.read(t, host).ok());
  return host;
}

// Relative to the row's spread: fp32 sums in another order.
void check_rows_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 1e-6;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  INFO(what << ": max |difference| " << worst << ", largest logit " << scale);
  CHECK(worst <= 2e-5 * scale + 1e-6);
}

void check_decode_matches_full(const ModelSpec& m) {
  CpuBackend b;
  const int T = m.seq_len, V = m.vocab, prompt = 5;
  const std::vector<std::int32_t> ids = sequence(T, V, 11);
  CachedDecoder full(b, m, T), cached(b, m, T);
  full.parameters().initialize(3);
  cached.parameters().initialize(3);
  const std::vector<float> all = read(b, full.forward(ids, true));  // (T, V): the whole sequence at once
  REQUIRE(full.length() == T);
  // Prefill of the prompt, every row.
  const std::vector<float> pre = read(b, cached.forward(std::span(ids).first(prompt), true));
  check_rows_close(pre, std::vector<float>(all.begin(), all.begin() + prompt * V), m.name + " prefill");
  // Then one token at a time over the cache.
  for (int t = prompt; t < T; ++t) {
    const std::vector<float> row = read(b, cached.forward(std::span(ids).subspan(t, 1), false));
    REQUIRE(cached.length() == t + 1);
    check_rows_close(row, std::vector<float>(all.begin() + t * V, all.begin() + (t + 1) * V),
                     m.name + " decode at position " + std::to_string(t));
  }
  // A cleared cache starts over: the same logits again.
  cached.clear();
  const std::vector<float> again = read(b, cached.forward(std::span(ids).first(prompt), false));
  check_rows_close(again, std::vector<float>(all.begin() + (prompt - 1) * V, all.begin() + prompt * V),
                   m.name + " after clear");
}

// Σ over positions of the cross-entropy of the next token, from the decoder's logits on the host.
double loss_from_logits(const std::vector<float>& logits, const std::vector<std::int32_t>& targets, int V) {
  double sum = 0;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const float* row = logits.data() + t * static_cast<std::size_t>(V);
    double top = row[0];
    for (int v = 1; v < V; ++v) top = std::max(top, static_cast<double>(row[v]));
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(row[v] - top);
    sum += std::log(z) + top - row[targets[t]];
  }
  return sum;
}

void check_same_function_as_training(ModelSpec m) {
  m.capacity_factor = 0.f;  // training drops nothing either
  CpuBackend b;
  const int T = m.seq_len - 1, V = m.vocab;
  const std::vector<std::int32_t> seq = sequence(T + 1, V, 5);
  const std::vector<std::int32_t> inputs(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  CachedDecoder decoder(b, m, m.seq_len);
  decoder.parameters().initialize(9);
  const double mine = loss_from_logits(read(b, decoder.forward(inputs, true)), targets, V);

  ModelChunk chunk(b, m, ChunkLayers{0, m.layers, true, true}, TensorParallel{Group{0, {0}}, 0, 1}, {});
  chunk.parameters().initialize(9);
  MicroBatch mb;
  mb.batch = 1, mb.seq = T;
  mb.ids = b.empty(Shape{T}, DType::i32);
  mb.targets = b.empty(Shape{T}, DType::i32);
  b.write(mb.ids, inputs);
  b.write(mb.targets, targets);
  SavedActivations saved;
  const double training = read(b, chunk.forward(mb, Tensor(), saved))[0];
  INFO(m.name << ": decoder loss sum " << mine << ", training forward " << training);
  CHECK(std::fabs(mine - training) <= 1e-4 * std::fabs(training));
}

}  // namespace

TEST_CASE("decoding over the KV cache gives the full forward's logits at every position", "[generate]") {
  SECTION("GPT: learned positions, LayerNorm, GELU, tied head") { check_decode_matches_full(gpt_spec()); }
  SECTION("Llama: RoPE, grouped-query attention, SwiGLU, RMSNorm") { check_decode_matches_full(llama_spec()); }
  SECTION("mixture of experts, a dense layer and a shared expert") {
    ModelSpec m = moe_spec();
    m.capacity_factor = 1.0f;  // would drop tokens of a full micro-batch; generation routes dropless
    check_decode_matches_full(m);
  }
  SECTION("heads wider than the residual stream (Qwen3's head_dim)") {
    ModelSpec m = llama_spec();
    m.head_dim_size = 16;  // q is 4 · 16 = 64 wide over a width of 32
    check_decode_matches_full(m);
    check_same_function_as_training(m);
  }
  SECTION("the tiny-moe preset (GPT-style experts)") {
    ModelSpec m = *model_preset("tiny-moe");
    m.seq_len = 24;
    check_decode_matches_full(m);
  }
}

TEST_CASE("the cached decoder computes the trained model's function", "[generate]") {
  SECTION("GPT") { check_same_function_as_training(gpt_spec()); }
  SECTION("Llama") { check_same_function_as_training(llama_spec()); }
  SECTION("MoE") { check_same_function_as_training(moe_spec()); }
}

TEST_CASE("vision and VQA models are not text decoders", "[generate]") {
  for (const char* name : {"vit-tiny", "swin-micro", "vqa-tiny"}) {
    const Status s = CachedDecoder::check_model(*model_preset(name));
    INFO(name);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains("not a text decoder") && Catch::Contains(name));
  }
  CHECK(CachedDecoder::check_model(*model_preset("tiny")).ok());
  CHECK(CachedDecoder::check_model(*model_preset("llama3-8b")).ok());
}

TEST_CASE("a decoder holds its parameters and caches, no gradients", "[generate]") {
  for (const ModelSpec& m : {gpt_spec(), llama_spec()}) {
    CpuBackend b;
    const std::int64_t before = b.memory_stats().live_bytes;
    CachedDecoder d(b, m, 16);
    // The cpu backend counts live bytes exactly: parameters and (layers, 16, H + 2G, D) f32 caches.
    std::int64_t params = 0;
    for (const ParamSlot& s : d.parameters().slots()) params += s.numel;
    const std::int64_t caches = static_cast<std::int64_t>(m.layers) * 16 * (m.heads + 2 * m.kv_heads) * m.head_dim();
    CHECK(b.memory_stats().live_bytes - before == 4 * (params + caches));
    CHECK(CachedDecoder::resident_bytes(m, 16) == Approx(4.0 * static_cast<double>(params + caches)));
    CHECK_FALSE(d.parameters().grads().defined());
  }
}
