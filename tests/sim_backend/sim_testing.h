// The set-up the simulation tests share: the model most of them time, a
// cluster preset, a plan checked valid and a simulated iteration that must
// succeed (each fails the test with the library's message otherwise).
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <string_view>
#include <utility>

#include "engine/simulation/simulation.h"
#include "models/model_spec.h"
#include "simulator/cluster_spec.h"

namespace meshtrain::sim_testing {

// GPT-2 124M at 256 tokens: small enough for a test and with every part of a transformer step.
inline ModelSpec small_gpt() {
  auto m = model_preset("gpt2-124m");
  REQUIRE(m.ok());
  ModelSpec s = *m;
  s.seq_len = 256;
  return s;
}

// A GPT of `layers` wide layers (width `hidden`, `heads` heads, an MLP of
// 4·hidden) over 2048 tokens with a vocabulary of 256, untied: each
// pipeline stage's work is its layers, the embedding and head are negligible.
inline ModelSpec uniform_model(int layers, int hidden, int heads) {
  ModelSpec m;
  m.name = "uniform";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn = 4 * hidden;
  m.vocab = 256;
  m.seq_len = 2048;
  m.tied_embeddings = false;
  return m;
}

inline sim::ClusterSpec preset(std::string_view name) {
  auto spec = sim::cluster_preset(name);
  REQUIRE(spec.ok());
  return *spec;
}

// Simulation options on a cluster preset, everything else at its default.
inline SimulateOptions on_cluster(std::string_view name) {
  SimulateOptions o;
  o.cluster = preset(name);
  return o;
}

// `p`, after checking that validate_plan accepts it for `m` on its own world size.
inline Plan checked(Plan p, const ModelSpec& m) {
  const Status valid = validate_plan(p, m, p.world_size());
  INFO((valid.ok() ? std::string() : valid.error().message()));
  REQUIRE(valid.ok());
  return p;
}

inline SimulationResult simulated(const ModelSpec& m, const Plan& p, const SimulateOptions& o) {
  auto r = simulate_iteration(m, p, o);
  INFO((r.ok() ? std::string() : r.error().message()));
  REQUIRE(r.ok());
  return std::move(r).value();
}

inline const SimCollectiveStats& stats(const SimulationResult& r, sim::CollectiveKind k) {
  return r.collectives[static_cast<std::size_t>(k)];
}

}  // namespace meshtrain::sim_testing
