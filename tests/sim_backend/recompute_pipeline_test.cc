// Full recomputation on a pipeline, against the schedule worked by hand.
//
// Megatron-LM (and the engine) re-runs a block's forward inside the
// backward of that block, so after the stage has received the output
// gradient: in 1F1B each backward of a micro-batch is its forward again
// (tf) followed by its backward (tb), on the same stage. Per stage and
// micro-batch the work is U = tf + (tf + tb), and a uniform pipeline with no
// communication takes
//   1F1B:          T = (m + p - 1)·U
//   interleaved:   T = m·U + (p - 1)·U/v   (v chunks per stage, U the whole stage's)
// plus what runs once per step (the optimizer). Selective recomputation with
// fused attention re-runs nothing, so full and selective differ by the
// recomputed forward on every micro-batch slot of the critical path:
//   T_full - T_selective = (m + p - 1)·tf   (interleaved: (m + (p - 1)/v)·tf).
// tf and tb are measured here on one stage alone (pp 1), never from the pipeline.
#include <catch2/catch.hpp>

#include "engine/simulation/simulation.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

constexpr int kLayersPerStage = 2;

// A vocabulary of 256 keeps the embedding and the head negligible next to the layers.
ModelSpec uniform_gpt(int layers) { return uniform_model(layers, 8192, 64); }

// dgx-h100 with links a thousand times faster: a pipeline hop costs its
// latency only, so the step is the schedule of the compute alone.
sim::ClusterSpec fast_links() {
  sim::ClusterSpec c = preset("dgx-h100");
  c.nvlink_bandwidth *= 1000;
  c.pcie_bandwidth *= 1000;
  c.nic_bandwidth *= 1000;
  return c;
}

// `stages` stages' worth of layers (pp, unless given) on pp stages.
SimulationResult simulate(int pp, int vpp, int microbatches, Recompute r, int stages = 0) {
  const ModelSpec m = uniform_gpt(kLayersPerStage * (stages > 0 ? stages : pp));
  Plan p;
  p.pp = pp;
  p.vpp = vpp;
  p.micro_batch = 1;
  p.global_batch = microbatches;
  p.schedule = vpp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
  p.recompute = r;
  SimulateOptions o;
  o.cluster = fast_links();
  o.check_memory = false;
  return simulated(m, checked(p, m), o);
}

// One stage's forward tf, backward tb and once-per-step work, from pp 1 runs
// (not the pipeline): the recomputation adds tf per micro-batch; a second
// micro-batch adds tf + tb of the layers plus the embedding's and head's
// work, which a model of twice the layers separates; the rest of a
// one-micro-batch step happens once.
struct StageCosts {
  double tf = 0, tb = 0, ends = 0, once = 0;
};

// The compute of one stage (pp 1) holding `stages` stages' worth of layers.
double compute_s(int stages, int microbatches, Recompute r) {
  return simulate(1, 1, microbatches, r, stages).stages[0].compute_s;
}

StageCosts one_stage() {
  const auto per_microbatch = [](int stages) {
    return compute_s(stages, 2, Recompute::selective) - compute_s(stages, 1, Recompute::selective);
  };
  StageCosts c;
  c.tf = compute_s(1, 1, Recompute::full) - compute_s(1, 1, Recompute::selective);
  c.tb = per_microbatch(2) - per_microbatch(1) - c.tf;
  c.ends = per_microbatch(1) - (c.tf + c.tb);
  c.once = simulate(1, 1, 1, Recompute::selective, 1).iteration_s - per_microbatch(1);
  return c;
}

// The step of m micro-batches over `slots` micro-batch times U = 2 tf + tb
// (slots = m + p - 1 for 1F1B) plus the once-per-step work. The embedding's
// and the head's work (`ends`) sit on the first and last stage: counted once
// it bounds the step from below, once per micro-batch from above (the last
// stage, slower by its head, paces the steady state); the two bounds are
// within 1% of each other here.
void check_step(const SimulationResult& full, const SimulationResult& selective, double slots, int m,
                const StageCosts& c) {
  const double base = slots * (2 * c.tf + c.tb) + c.once;
  const double lower = base + c.ends, upper = base + m * c.ends;
  const StageResult& middle = full.stages[full.stages.size() / 2];
  INFO("slots " << slots << ": tf " << c.tf << " s, tb " << c.tb << " s, ends " << c.ends << " s, once " << c.once
                << " s; full " << full.iteration_s << " s, expected " << lower << " to " << upper << " s; selective "
                << selective.iteration_s << " s; a middle stage idle " << middle.idle_s << " s");
  REQUIRE(upper < 1.01 * lower);
  CHECK(full.iteration_s > 0.999 * lower);
  CHECK(full.iteration_s < 1.001 * upper);
  // The recomputation neither hides in the bubble nor adds to it: selective
  // (nothing re-run) is shorter by the recomputed forward in every slot.
  CHECK(full.iteration_s - selective.iteration_s == Approx(slots * c.tf).epsilon(0.002));
  // A middle stage idles for the fill and drain, the slots it does not fill,
  // each 2 tf + tb (and, at most, for the last stage's head on every micro-batch).
  const double bubble = (slots - m) * (2 * c.tf + c.tb);
  CHECK(middle.idle_s > 0.99 * bubble);
  CHECK(middle.idle_s < 1.01 * (bubble + m * c.ends));
  // All of it is the pipeline's, also the drain's wait at the gradient norm's
  // all-reduce over the stages (tp 1: there is no TP/CP/EP to expose).
  CHECK(middle.idle.model_parallel_s == 0);
  CHECK(middle.idle.pipeline_s == Approx(middle.idle_s).epsilon(1e-9));
}

}  // namespace

TEST_CASE("full recomputation: 1F1B takes (m + p - 1)(2 tf + tb), selective less by (m + p - 1) tf",
          "[sim_backend][pipeline]") {
  const StageCosts c = one_stage();
  // Independent of the pipeline: a layer's backward is about twice its forward.
  REQUIRE(c.tb > 1.5 * c.tf);
  REQUIRE(c.tb < 2.5 * c.tf);
  for (int p : {2, 8, 32}) {
    const int m = 4 * p;  // the same bubble share (p - 1)/(m + p - 1) at every depth
    INFO("pp " << p << ", m " << m);
    check_step(simulate(p, 1, m, Recompute::full), simulate(p, 1, m, Recompute::selective), m + p - 1, m, c);
  }
}

TEST_CASE("full recomputation: interleaved 1F1B takes (m + (p - 1)/v)(2 tf + tb)", "[sim_backend][pipeline]") {
  // Two chunks per stage of one layer each: a chunk's work is half a stage's,
  // and the fill and drain cross p - 1 chunks.
  const StageCosts c = one_stage();
  const int v = 2;
  for (int p : {2, 8, 32}) {
    const int m = 4 * p;
    INFO("pp " << p << ", vpp " << v << ", m " << m);
    check_step(simulate(p, v, m, Recompute::full), simulate(p, v, m, Recompute::selective),
               m + static_cast<double>(p - 1) / v, m, c);
  }
}

TEST_CASE("idle by cause: waiting for other stages at a collective is the bubble, for a TP peer exposed TP",
          "[sim_backend][pipeline]") {
  // tp 2, pp 2, every rank simulated; rank 1 (stage 0's second TP rank) 30%
  // slower: its TP peer waits for it at every tensor-parallel all-reduce,
  // and stage 1, drained first, waits for stage 0 at the norm's all-reduce.
  const ModelSpec m = uniform_gpt(2 * kLayersPerStage);
  Plan p;
  p.tp = 2;
  p.pp = 2;
  p.micro_batch = 1;
  p.global_batch = 4;
  SimulateOptions o;
  o.cluster = fast_links();
  o.check_memory = false;
  o.variation.stragglers = {{1, 1.3}};
  const SimulationResult res = simulated(m, checked(p, m), o);
  const StageResult& first = res.stages[0];
  const StageResult& second = res.stages[1];
  INFO("stage 0 idle " << first.idle_s << " s (pipeline " << first.idle.pipeline_s << ", TP "
                       << first.idle.model_parallel_s << "); stage 1 idle " << second.idle_s << " s (pipeline "
                       << second.idle.pipeline_s << ", TP " << second.idle.model_parallel_s << ")");
  CHECK(first.idle.model_parallel_s > 0.1 * first.idle_s);
  CHECK(second.idle.model_parallel_s < 0.01 * second.idle_s);
}
