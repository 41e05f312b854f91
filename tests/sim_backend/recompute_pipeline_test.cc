// Full recomputation on a pipeline: a chunk's first recomputed forward runs
// while the stage waits for its output gradient (step_engine.cc,
// before_grad), so each hop of the drain is shorter by one block's forward.
#include <catch2/catch.hpp>

#include "engine/simulation/simulation.h"

using namespace meshtrain;

namespace {

// Wide layers, a tiny vocabulary, two layers per stage: each stage's work is
// its two equal layers, and a micro-batch's compute dwarfs what it sends.
ModelSpec two_layers_per_stage() {
  ModelSpec m;
  m.name = "uniform-8";
  m.layers = 8;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 32;
  m.ffn = 16384;
  m.vocab = 256;
  m.seq_len = 2048;
  m.tied_embeddings = false;
  return m;
}

SimulationResult simulate(const ModelSpec& m, Recompute r) {
  Plan p;
  p.pp = 4;
  p.micro_batch = 4;
  p.global_batch = 16;  // m = 4 micro-batches
  p.schedule = ScheduleKind::one_f_one_b;
  p.recompute = r;
  REQUIRE(validate_plan(p, m, p.world_size()).ok());
  SimulateOptions o;
  o.cluster = *sim::cluster_preset("dgx-h100");
  o.check_memory = false;
  auto res = simulate_iteration(m, p, o);
  REQUIRE(res.ok());
  return std::move(res).value();
}

}  // namespace

TEST_CASE("full recomputation: the drain is shorter by one block's forward per hop", "[sim_backend][pipeline]") {
  // Derivation. Each stage computes U = F + R + W per micro-batch (forward,
  // recomputed forward R = F, backward W) and m·U per iteration. 1F1B ends
  // when the last micro-batch's gradient has crossed back to stage 0: the
  // last stage finishes at (p-1)F + m·U, then each of the p-1 hops costs its
  // backward, R + W, had the recomputation waited for the gradient, so
  //   T = (m + p - 1)·U,   idle per stage = (p-1)·U.
  // Every stage sits idle for at least F before that last gradient arrives,
  // so it can run the first block's recomputed forward, R1 = F/2 here (two
  // equal layers per stage), in the wait: each hop costs U - F - R1, and
  //   idle per stage = (p-1)·(U - R1),   T = m·U + (p-1)·(U - R1).
  // F comes from the same plan without recomputation: U - U0 = R = F.
  const ModelSpec m = two_layers_per_stage();
  const int p = 4, mb = 4;
  const SimulationResult full = simulate(m, Recompute::full);
  const SimulationResult none = simulate(m, Recompute::none);
  // Stage 1 (no embedding, no head): its compute is its two layers.
  const double U = full.stages[1].compute_s / mb, U0 = none.stages[1].compute_s / mb;
  const double F = U - U0, R1 = F / 2;
  REQUIRE(F > 0.2 * U);
  const double idle = (p - 1) * (U - R1), iteration = mb * U + idle;
  const double waiting_for_gradient = static_cast<double>(p - 1) / (mb + p - 1);  // the old figure
  INFO("U " << U << " s, F " << F << " s; bubble " << full.bubble_fraction << ", expected " << idle / iteration
            << ", recomputation after the wait would give " << waiting_for_gradient);
  CHECK(full.iteration_s == Approx(iteration).epsilon(0.02));
  CHECK(full.bubble_fraction == Approx(idle / iteration).epsilon(0.03));
  CHECK(full.bubble_fraction < waiting_for_gradient - 0.02);
}
