// The whole model on the cpu backend: loss at initialisation and the gradient
// of every parameter against central finite differences of the loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "tests/models/directional_derivatives.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;

namespace {

using testing::tiny_gpt2;
using testing::tiny_llama;

using Fixture = testing::TokenModel;

// The directional derivatives of the loss (tests/models/directional_derivatives.h).
// Observed without the resolution allowance: 0.7e-4 to 1.7e-4 relative, the
// fp32 rounding of the loss over a 2e-3 difference.
void check_gradient(const ModelSpec& spec) {
  const std::uint64_t seed = 7;
  INFO("model " << spec.name << ", seed " << seed);
  Fixture f(spec, seed, 2, 16);
  testing::check_directional_derivatives(f.b, f.chunk.parameters(), f.gradient(), [&] { return f.loss(); });
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
