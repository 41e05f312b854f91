// Recompute modules (Plan::recompute_modules, Megatron-Core's
// --recompute-modules moe_act and layernorm) on the sim backend: each adds
// exactly its recomputed forward kernels to a step and takes exactly its
// freed outputs off the peak, and the memory model says the same. The
// figures are derived here from the model's shapes.
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

TEST_CASE("recompute modules moe_act and layernorm: the experts' activation and the MoE layer's pre-MLP norm run "
          "again in backward, their outputs off the peak",
          "[sim_backend][recompute][moe]") {
  const ModelSpec m = *model_preset("qwen3-30b-a3b");
  SimulateOptions o = on_cluster("dgx-h100");
  o.check_memory = false;  // 30B parameters on one GPU: only the differences are asked
  const sim::CostModel cost(o.cluster.device, sim::CostConstants{});
  const std::int64_t tokens = 2 * static_cast<std::int64_t>(m.seq_len), h = m.hidden, F = m.ffn;
  const std::int64_t assignments = tokens * m.top_k, layers = m.moe_layer_count();
  const Plan plain = one_rank(1, {}), act = one_rank(1, {.moe_act = true}), both = one_rank(1, {true, true});
  const SimulationResult a = simulated(m, plain, o), b = simulated(m, act, o), c = simulated(m, both, o);
  // SwiGLU over every assignment's up output (2F) into its activation (F), bf16.
  const double act_bytes = 2.0 * assignments * (2 * F + F);
  CHECK(b.stages.at(0).compute_s - a.stages.at(0).compute_s ==
        Approx(layers * seconds(cost.memory_bound(act_bytes, "swiglu_forward"))).epsilon(1e-6));
  const double freed_act = 2.0 * layers * assignments * F;
  CHECK(static_cast<double>(a.stages.at(0).peak_bytes - b.stages.at(0).peak_bytes) == freed_act);
  CHECK(rank_memory(m, plain, 0).activations - rank_memory(m, act, 0).activations == Approx(freed_act));
  // The pre-MLP RMSNorm over (tokens, h): x2 read and its output written (bf16), the bf16 weight, the
  // f32 rstd; its output, the experts' input, off the peak.
  const double norm_bytes = 2.0 * (2 * tokens * h + h) + 4.0 * tokens;
  CHECK(c.stages.at(0).compute_s - b.stages.at(0).compute_s ==
        Approx(layers * seconds(cost.memory_bound(norm_bytes, "rmsnorm_forward"))).epsilon(1e-6));
  const double freed_norm = 2.0 * layers * tokens * h;
  CHECK(static_cast<double>(b.stages.at(0).peak_bytes - c.stages.at(0).peak_bytes) == freed_norm);
  CHECK(rank_memory(m, act, 0).activations - rank_memory(m, both, 0).activations == Approx(freed_norm));
}

TEST_CASE("recompute modules need experts: a dense model's are refused, naming why", "[sim_backend][recompute]") {
  for (const RecomputeModules r : {RecomputeModules{.layernorm = true}, RecomputeModules{.moe_act = true}}) {
    const Status refused = validate_plan(one_rank(1, r), small_gpt());
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.error().message(), Catch::Contains("model 'gpt2-124m' has no experts"));
  }
  CHECK_THAT(validate_plan(one_rank(1, {.layernorm = true}), small_gpt()).error().message(),
             Catch::Contains("Transformer Engine fuses a dense layer's norms"));
}
