// Recompute modules (Plan::recompute_modules, Megatron-Core's
// --recompute-modules layernorm and moe_act) on the sim backend: each adds
// exactly its recomputed forward kernels to a step and takes exactly its
// freed outputs off the peak, and the memory model says the same. The
// figures are derived here from the models' shapes.
#include <catch2/catch.hpp>

#include "engine/plan/segment_plan.h"
#include "engine/simulation/simulation.h"
#include "simulator/cost_model.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

// One rank, `microbatches` micro-batches of 2 sequences, bf16.
Plan one_rank(int microbatches, RecomputeModules modules) {
  Plan p;
  p.micro_batch = 2;
  p.global_batch = 2 * microbatches;
  p.precision = Precision::bf16;
  p.recompute_modules = modules;
  return p;
}

double seconds(sim::Time t) { return sim::to_seconds(t); }

}  // namespace

TEST_CASE("recompute module layernorm: each layer's two norms run again in backward, their outputs off the peak",
          "[sim_backend][recompute]") {
  const ModelSpec m = small_gpt();
  const SimulateOptions o = on_cluster("dgx-h100");
  const sim::CostModel cost(o.cluster.device, sim::CostConstants{});
  const std::int64_t rows = 2 * 256, h = 768, layers = 12;
  // A LayerNorm forward over (rows, h) bf16: x and its output, the bf16 weight and bias, the f32 mean and rstd.
  const double norm_bytes = 2.0 * (2 * rows * h + 2 * h) + 8.0 * rows;
  const double norm_s = seconds(cost.memory_bound(norm_bytes, "layernorm_forward"));
  for (const int microbatches : {1, 2}) {
    INFO(microbatches << " micro-batches");
    const Plan plain = one_rank(microbatches, {}), norms = one_rank(microbatches, {.layernorm = true});
    const SimulationResult a = simulated(m, plain, o), b = simulated(m, norms, o);
    CHECK(b.stages.at(0).compute_s - a.stages.at(0).compute_s ==
          Approx(2.0 * layers * microbatches * norm_s).epsilon(1e-6));
    // One micro-batch in flight at the peak (one rank, 1F1B): every layer's two bf16 norm outputs.
    const double freed = 2.0 * layers * rows * h * 2;
    CHECK(static_cast<double>(a.stages.at(0).peak_bytes - b.stages.at(0).peak_bytes) == freed);
    CHECK(rank_memory(m, plain, 0).activations - rank_memory(m, norms, 0).activations == Approx(freed));
  }
}

TEST_CASE("recompute module moe_act: the experts' activation runs again in backward, its output off the peak; an "
          "MoE layer's MLP norm stays",
          "[sim_backend][recompute][moe]") {
  const ModelSpec m = *model_preset("qwen3-30b-a3b");
  SimulateOptions o = on_cluster("dgx-h100");
  o.check_memory = false;  // 30B parameters on one GPU: only the activations' difference is asked
  const sim::CostModel cost(o.cluster.device, sim::CostConstants{});
  const std::int64_t tokens = 2 * static_cast<std::int64_t>(m.seq_len), h = m.hidden, F = m.ffn;
  const std::int64_t assignments = tokens * m.top_k, layers = m.moe_layer_count();
  Plan plain = one_rank(1, {}), act = one_rank(1, {.moe_act = true}), both = one_rank(1, {true, true});
  for (Plan* p : {&plain, &act, &both}) p->micro_batch = 2, p->global_batch = 2;
  const SimulationResult a = simulated(m, plain, o), b = simulated(m, act, o), c = simulated(m, both, o);
  // SwiGLU over every assignment's up output (2F) into its activation (F), bf16.
  const double act_bytes = 2.0 * assignments * (2 * F + F);
  CHECK(b.stages.at(0).compute_s - a.stages.at(0).compute_s ==
        Approx(layers * seconds(cost.memory_bound(act_bytes, "swiglu_forward"))).epsilon(1e-6));
  const double freed_act = 2.0 * layers * assignments * F;
  CHECK(static_cast<double>(a.stages.at(0).peak_bytes - b.stages.at(0).peak_bytes) == freed_act);
  CHECK(rank_memory(m, plain, 0).activations - rank_memory(m, act, 0).activations == Approx(freed_act));
  // layernorm on an MoE model frees the attention's norm output only: the experts keep the MLP's.
  const double freed_norm = 2.0 * layers * tokens * h;
  CHECK(static_cast<double>(b.stages.at(0).peak_bytes - c.stages.at(0).peak_bytes) == freed_norm);
  CHECK(rank_memory(m, act, 0).activations - rank_memory(m, both, 0).activations == Approx(freed_norm));
}
