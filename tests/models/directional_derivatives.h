// What the model tests share: a decoder on one micro-batch of random tokens,
// a chunk's mean loss and its gradient, and the whole-model gradient check: central differences
// of the fp32 objective along each parameter tensor's own gradient direction
// d = g / |g|, against g · d = |g| from backward, so that a wrong gradient in
// any one tensor cannot hide behind the others.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "models/parameter_store.h"

namespace meshtrain::testing {

// The chunk's summed loss over `terms` (its loss terms: tokens, images or answers).
inline double chunk_loss(Backend& b, ModelChunk& chunk, const MicroBatch& mb, double terms) {
  SavedActivations saved;
  Tensor l = chunk.forward(mb, Tensor(), saved);
  float host = 0;
  REQUIRE(b.read(l, std::span<float>(&host, 1)).ok());
  return host / terms;
}

// The gradient of chunk_loss over the chunk's flat parameters.
inline std::vector<float> chunk_gradient(Backend& b, ModelChunk& chunk, const MicroBatch& mb, double terms) {
  chunk.parameters().zero_grads();
  SavedActivations saved;
  chunk.forward(mb, Tensor(), saved);
  chunk.backward(mb, saved, Tensor(), static_cast<float>(1.0 / terms));
  std::vector<float> g(static_cast<std::size_t>(chunk.parameters().numel()));
  REQUIRE(b.read(chunk.parameters().grads(), g).ok());
  return g;
}

// A whole decoder on one cpu rank and one micro-batch of seeded random tokens.
struct TokenModel {
  CpuBackend b;
  ModelSpec m;
  ModelChunk chunk;
  MicroBatch mb;
  TokenModel(const ModelSpec& spec, std::uint64_t seed, int batch, int seq)
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
  double loss() { return chunk_loss(b, chunk, mb, mb.batch * mb.seq); }
  std::vector<float> gradient() { return chunk_gradient(b, chunk, mb, mb.batch * mb.seq); }
};

struct DirectionalCheck {
  double tolerance = 1e-3;  // relative, on top of what fp32 objectives resolve
  // Also cap the step so that no element moves by more than 3e-3: a tensor
  // with a tiny gradient (a relative position table at initialisation) would
  // otherwise be stepped far into the softmax's curvature.
  bool cap_element_step = false;
  bool skip_zero = false;  // tensors without gradient (an expert no token reached) pass
};

// `g`: the gradient backward wrote for the parameters' current values;
// `objective`: the value backward differentiates, at the parameters' current
// values. Restores the values afterwards.
inline void check_directional_derivatives(Backend& b, ParameterStore& params, const std::vector<float>& g,
                                          const std::function<double()>& objective, DirectionalCheck c = {}) {
  std::vector<float> theta(g.size());
  REQUIRE(b.read(params.values(), theta).ok());
  auto at = [&](const std::vector<double>& dir, double eps) {
    std::vector<float> p(theta.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(theta[i] + eps * dir[i]);
    b.write(params.values(), p);
    return objective();
  };
  for (const ParamSlot& slot : params.slots()) {
    INFO("parameter " << slot.info.name);
    std::vector<double> dir(g.size(), 0.0);
    double norm = 0, largest = 0;
    for (std::int64_t i = 0; i < slot.numel; ++i) norm += double(g[slot.offset + i]) * g[slot.offset + i];
    norm = std::sqrt(norm);
    if (c.skip_zero && norm == 0) continue;
    REQUIRE(norm > 0);
    for (std::int64_t i = 0; i < slot.numel; ++i) {
      dir[slot.offset + i] = g[slot.offset + i] / norm;
      largest = std::max(largest, std::abs(dir[slot.offset + i]));
    }
    // A step that moves the objective by ~1e-3: well above fp32 rounding, small for curvature.
    const double eps = c.cap_element_step ? std::min(1e-3 / norm, 3e-3 / largest) : 1e-3 / norm;
    const double up = at(dir, eps), down = at(dir, -eps);
    const double numeric = (up - down) / (2 * eps);
    // What fp32 objectives can resolve: a few ulps of each over the step.
    const double resolution = 4 * 6e-8 * (std::abs(up) + std::abs(down)) / (2 * eps);
    CHECK(std::abs(numeric - norm) <= c.tolerance * norm + resolution);
  }
  b.write(params.values(), theta);
}

}  // namespace meshtrain::testing
