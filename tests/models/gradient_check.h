// The gradient check the model tests make: for every parameter tensor, the
// directional derivative of the loss along that tensor's own gradient by
// central differences, against the gradient's norm from backward, so that a
// wrong gradient in any one tensor cannot hide; and the whole-model chunk's
// loss and gradient it compares.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "models/model_chunk.h"
#include "models/parameter_store.h"

namespace meshtrain::testing {

struct GradientCheck {
  double tolerance = 1e-3;  // relative
  // The step moves the loss by ~1e-3 but no element by more than this:
  // tensors with tiny gradients would otherwise be stepped far into the
  // model's curvature.
  double max_element_step = std::numeric_limits<double>::infinity();
  // Also allow what fp32 losses can resolve over the step (a few ulps of each).
  bool allow_fp32_resolution = false;
};

// The loss of micro-batch `mb` through a chunk of the whole model: its Σ over `terms` (targets).
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

// `g`: the gradient of `loss` over the store's flat values; `loss` reads the
// store's current values.
inline void check_gradient_directions(Backend& b, ParameterStore& params, const std::vector<float>& g,
                                      const std::function<double()>& loss, const GradientCheck& c) {
  std::vector<float> theta(g.size());
  REQUIRE(b.read(params.values(), theta).ok());
  auto loss_at = [&](const std::vector<double>& dir, double eps) {
    std::vector<float> p(theta.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(theta[i] + eps * dir[i]);
    b.write(params.values(), p);
    return loss();
  };
  for (const ParamSlot& slot : params.slots()) {
    INFO("parameter " << slot.info.name);
    std::vector<double> dir(g.size(), 0.0);
    double norm = 0, largest = 0;
    for (std::int64_t i = 0; i < slot.value.numel(); ++i) norm += double(g[slot.offset + i]) * g[slot.offset + i];
    norm = std::sqrt(norm);
    REQUIRE(norm > 0);
    for (std::int64_t i = 0; i < slot.value.numel(); ++i) {
      dir[slot.offset + i] = g[slot.offset + i] / norm;
      largest = std::max(largest, std::abs(dir[slot.offset + i]));
    }
    const double eps = std::min(1e-3 / norm, c.max_element_step / largest);
    const double up = loss_at(dir, eps), down = loss_at(dir, -eps);
    const double numeric = (up - down) / (2 * eps);
    const double resolution = c.allow_fp32_resolution ? 4 * 6e-8 * (std::abs(up) + std::abs(down)) / (2 * eps) : 0;
    CHECK(std::abs(numeric - norm) <= c.tolerance * norm + resolution);
  }
  b.write(params.values(), theta);
}

}  // namespace meshtrain::testing
