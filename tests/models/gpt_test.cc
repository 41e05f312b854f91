// The whole model on the cpu backend: loss at initialisation and the gradient
// of every parameter against central finite differences of the loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "tests/models/gradient_check.h"

using namespace meshtrain;

namespace {

ModelSpec tiny_gpt2() {
  ModelSpec m = *model_preset("tiny");
  m.layers = 2;
  m.seq_len = 16;
  return m;
}

ModelSpec tiny_llama() {
  ModelSpec m = tiny_gpt2();
  m.name = "tiny-llama";
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.tied_embeddings = false;
  m.bias = false;
  m.kv_heads = 2;
  m.ffn = 96;
  return m;
}

struct Fixture {
  CpuBackend b;
  ModelSpec m;
  ModelChunk chunk;
  MicroBatch mb;
  Fixture(const ModelSpec& spec, std::uint64_t seed, int batch, int seq)
      : m(spec), chunk(b, m, ChunkLayers{0, spec.layers, true, true}, TensorParallel{Group{0, {0}}, 0, 1}, {}) {
    chunk.parameters().initialize(seed);
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * seq)), targets(ids.size());
    for (auto& v : ids) v = static_cast<std::int32_t>(rng() % 256);
    for (auto& v : targets) v = static_cast<std::int32_t>(rng() % 256);
    mb.ids = b.empty(Shape{batch * seq}, DType::i32);
    mb.targets = b.empty(Shape{batch * seq}, DType::i32);
    b.write(mb.ids, ids);
    b.write(mb.targets, targets);
    mb.batch = batch;
    mb.seq = seq;
  }
  double loss() { return testing::chunk_loss(b, chunk, mb, mb.batch * mb.seq); }
  std::vector<float> gradient() { return testing::chunk_gradient(b, chunk, mb, mb.batch * mb.seq); }
};

// Directional derivative along d = g / |g| by central differences of the fp32
// loss, against g · d = |g| from backward, plus each parameter tensor's own
// direction so that a wrong gradient in any one tensor cannot hide.
void check_gradient(const ModelSpec& spec) {
  const std::uint64_t seed = 7;
  INFO("model " << spec.name << ", seed " << seed);
  Fixture f(spec, seed, 2, 16);
  const std::vector<float> g = f.gradient();
  // Observed: 0.7e-4 to 1.7e-4 relative, the fp32 rounding of the loss over a 2e-3 difference.
  testing::check_gradient_directions(f.b, f.chunk.parameters(), g, [&] { return f.loss(); }, {});
}

}  // namespace

TEST_CASE("the loss at initialisation is close to ln(vocab)", "[gpt]") {
  Fixture f(tiny_gpt2(), 1, 2, 16);
  CHECK(f.loss() == Approx(std::log(256.0)).margin(0.05));
}

TEST_CASE("GPT-2 gradients match finite differences of the loss", "[gpt]") { check_gradient(tiny_gpt2()); }

TEST_CASE("Llama gradients match finite differences of the loss", "[gpt]") { check_gradient(tiny_llama()); }

TEST_CASE("full recomputation gives the same gradient bits", "[gpt]") {
  Fixture plain(tiny_gpt2(), 3, 2, 16);
  CpuBackend b;
  ModelSpec m = tiny_gpt2();
  ModelChunk recompute(b, m, ChunkLayers{0, m.layers, true, true}, TensorParallel{Group{0, {0}}, 0, 1},
                     ChunkOptions{Recompute::full, 0.f});
  recompute.parameters().initialize(3);
  MicroBatch mb = plain.mb;
  std::vector<std::int32_t> ids(32), targets(32);
  std::vector<float> tmp(32);
  REQUIRE(plain.b.read(plain.mb.ids, tmp).ok());
  for (int i = 0; i < 32; ++i) ids[i] = static_cast<std::int32_t>(tmp[i]);
  REQUIRE(plain.b.read(plain.mb.targets, tmp).ok());
  for (int i = 0; i < 32; ++i) targets[i] = static_cast<std::int32_t>(tmp[i]);
  mb.ids = b.empty(Shape{32}, DType::i32);
  mb.targets = b.empty(Shape{32}, DType::i32);
  b.write(mb.ids, ids);
  b.write(mb.targets, targets);
  SavedActivations saved;
  recompute.forward(mb, Tensor(), saved);
  recompute.backward(mb, saved, Tensor(), 1.f / 32);
  std::vector<float> g(static_cast<std::size_t>(recompute.parameters().numel()));
  REQUIRE(b.read(recompute.parameters().grads(), g).ok());
  CHECK(g == plain.gradient());
}

TEST_CASE("a tensor-parallel shard initialises to the slice of the full tensor", "[gpt]") {
  ModelSpec m = tiny_gpt2();
  CpuBackend b;
  ModelChunk whole(b, m, ChunkLayers{0, 2, true, true}, TensorParallel{Group{0, {0}}, 0, 1}, {});
  ModelChunk shard(b, m, ChunkLayers{0, 2, true, true}, TensorParallel{Group{0, {0, 1}}, 1, 2}, {});
  whole.parameters().initialize(5);
  shard.parameters().initialize(5);
  const ParamSlot& full_qkv = whole.parameters()["layers.1.attn.qkv.weight"];
  const ParamSlot& part_qkv = shard.parameters()["layers.1.attn.qkv.weight"];
  std::vector<float> full(static_cast<std::size_t>(full_qkv.value.numel())),
      part(static_cast<std::size_t>(part_qkv.value.numel()));
  REQUIRE(b.read(full_qkv.value, full).ok());
  REQUIRE(b.read(part_qkv.value, part).ok());
  // (64, 192) split per segment q|k|v of 64 columns: rank 1 holds columns 32..63 of each.
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 96; ++c) {
      const int segment = c / 32, col = segment * 64 + 32 + c % 32;
      REQUIRE(part[r * 96 + c] == full[r * 192 + col]);
    }
}
