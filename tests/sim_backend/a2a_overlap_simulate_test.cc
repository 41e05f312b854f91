// EP all-to-all overlap simulated (Plan::moe_a2a_overlap, Megatron-Core's
// combined 1F1B): what the trace of one pair shows, derived from Megatron's
// order of a pair's phases (model_chunk_schedule_plan.py), and what it
// changes in time and memory.
//   expert stream:  B combine-bwd | F dispatch   | B dispatch-bwd | F combine
//   compute stream: F attention   | B experts    | F experts      | B attention
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/memory/memory_model.h"
#include "engine/plan/segment_plan.h"
#include "tests/sim_backend/sim_testing.h"
#include "tests/sim_backend/trace_streams.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

// Rank 0's complete events on its compute and expert-parallel streams, each sorted by start.
struct RankTrace {
  std::vector<TraceOp> compute, expert;
};

RankTrace rank0_trace(const std::string& json) {
  const auto streams = rank0_streams(json);
  return {stream_ops(streams, "compute"), stream_ops(streams, "expert-parallel")};
}

// Whether an op named `name` runs on `ops` during part of `during`.
bool runs_during(const std::vector<TraceOp>& ops, const std::string& name, const TraceOp& during) {
  return std::any_of(ops.begin(), ops.end(), [&](const TraceOp& o) {
    return o.name == name && o.ts < during.end && o.end > during.ts;
  });
}

int count(const std::vector<TraceOp>& ops, const std::string& name) {
  return static_cast<int>(std::count_if(ops.begin(), ops.end(), [&](const TraceOp& o) { return o.name == name; }));
}

// Two MoE layers of 8 experts, d_model 1024, over two DGX H100 nodes: EP 16 crosses the network, so
// each all-to-all is as long as a phase's compute.
ModelSpec two_layer_moe() {
  ModelSpec m = *model_preset("moe-seed");
  m.name = "moe-two";
  m.layers = 2, m.hidden = 1024, m.heads = 8, m.kv_heads = 8, m.ffn = 2816, m.experts = 16;
  return m;
}

Plan plan(int microbatches, bool overlap) {
  Plan p;
  p.dp = 16, p.ep = 16;
  p.micro_batch = 1;
  p.global_batch = 16 * microbatches;
  p.seq_len = 2048;
  p.precision = Precision::bf16;
  p.moe_a2a_overlap = overlap;
  return p;
}

SimulationResult run(const ModelSpec& m, const Plan& p) {
  SimulateOptions o = on_cluster("dgx-h100");
  o.trace = true;
  return simulated(m, checked(p, m), o);
}

}  // namespace

TEST_CASE("EP all-to-all overlap: a pair's all-to-alls run on the expert stream under the other pass's compute",
          "[sim_backend][moe][a2a_overlap]") {
  const ModelSpec m = two_layer_moe();
  const int mbs = 3, layers = m.layers;
  const SimulationResult off = run(m, plan(mbs, false)), on = run(m, plan(mbs, true));
  const RankTrace a = rank0_trace(off.trace_json), b = rank0_trace(on.trace_json);
  // Four token all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and backward); the
  // per-expert counts' exchange (one per forward) stays on the compute stream.
  CHECK(count(a.expert, "all_to_all") == 0);
  CHECK(count(a.compute, "all_to_all") == 5 * layers * mbs);
  CHECK(count(b.expert, "all_to_all") == 4 * layers * mbs);
  CHECK(count(b.compute, "all_to_all") == layers * mbs);
  // F0 alone, then pairs (F1, B0) and (F2, B1), then B2. A pair's layer i forward runs with its layer L-1-i
  // backward: the expert stream's all-to-alls of a pair come in Megatron's order, each under its partner's
  // compute. The pair (F1, B0)'s first are the 2·layers + 1-th of the step (after F0's 2 per layer).
  const std::size_t first = static_cast<std::size_t>(2 * layers);
  REQUIRE(b.expert.size() >= first + 4);
  CHECK(runs_during(b.compute, "attention_forward", b.expert[first]));      // B's combine-bwd under F's attention
  CHECK(runs_during(b.compute, "grouped_gemm", b.expert[first + 1]));       // F's dispatch under B's experts
  CHECK(runs_during(b.compute, "grouped_gemm", b.expert[first + 2]));       // B's dispatch-bwd under F's experts
  CHECK(runs_during(b.compute, "attention_backward", b.expert[first + 3])); // F's combine under B's attention
  // Each all-to-all of the pair waits for the one before it on the stream (one stream, FIFO).
  for (std::size_t k = first + 1; k < first + 4; ++k) CHECK(b.expert[k].ts >= b.expert[k - 1].end);

  // Time: the plan without overlap has its all-to-alls on the compute stream, nothing idle but the tail;
  // with it the iteration is shorter, yet no shorter than either stream's busy time.
  REQUIRE(on.moe.has_value());
  REQUIRE(off.moe.has_value());
  CHECK(off.moe->all_to_all_exposed_s == off.moe->all_to_all_s);
  CHECK(on.iteration_s < off.iteration_s);
  double expert_busy = 0;
  for (const TraceOp& o : b.expert) expert_busy += (o.end - o.ts) * 1e-6;
  CHECK(on.iteration_s >= expert_busy);
  CHECK(on.iteration_s >= on.stages.at(0).compute_s);
  // The compute stream's waits for the expert stream are the exposed all-to-all, reported as exposed EP
  // communication (no tensor or context parallelism here), not as "other".
  CHECK(on.moe->all_to_all_exposed_s > 0);
  CHECK(on.moe->all_to_all_exposed_s < on.moe->all_to_all_s);
  CHECK(on.idle.model_parallel_s == Approx(on.moe->all_to_all_exposed_s).epsilon(1e-9));
  CHECK(on.idle.other_s == 0);
}

TEST_CASE("EP all-to-all overlap holds one layer more at most, not a micro-batch more",
          "[sim_backend][moe][a2a_overlap]") {
  // A pair runs its forward's layer i beside its backward's layer L-1-i: the backward frees a layer as the
  // forward keeps one. Walked by hand with chunks of 1 and layers of 0.25, from the paired rows
  // (tests/schedule/a2a_overlap_test.cc), pairs in parentheses:
  //   1F1B p 1 m 4:  F0 (F1 B0) (F2 B1) (F3 B2) B3             holds 1, each pair 1 + 0.25; plain F0 B0 ...: 1
  //   interleaved p 2 v 2 m 4, rank 0: F0 F1 F0.1 F1.1 F2 (F3 B0.1) (F2.1 B1.1) (F3.1 B0) B1 ...: 5.25
  //     against plain's warm-up 4 + 1 = 5; rank 1: F0 F1 F0.1 (F1.1 B0.1) (F2 B1.1) ...: 3.25 against 3.
  const std::vector<double> quarters = {0.25, 0.25, 0.25, 0.25};
  auto walked = [&](Plan p, int stage, bool overlap, const std::vector<double>& layers) {
    p.moe_a2a_overlap = overlap;
    const std::vector<std::vector<double>> chunk_layers(static_cast<std::size_t>(p.vpp), layers);
    return peak_activation_bytes(p, stage, std::vector<double>(static_cast<std::size_t>(p.vpp), 1.0), {},
                                 chunk_layers);
  };
  Plan flat = plan(4, false);
  CHECK(walked(flat, 0, false, quarters) == Approx(1.0));
  CHECK(walked(flat, 0, true, quarters) == Approx(1.25));
  // Unlike layers (two dense of 0.4 before two MoE of 0.1): the forward's second dense layer arrives
  // while the backward has freed only its two MoE layers' first: 1 + 0.4 - 0.1 + 0.4 = 1.7.
  CHECK(walked(flat, 0, true, {0.4, 0.4, 0.1, 0.1}) == Approx(1.7));
  Plan interleaved = plan(4, false);
  interleaved.pp = 2, interleaved.vpp = 2, interleaved.dp = 8, interleaved.ep = 8, interleaved.global_batch = 32;
  interleaved.schedule = ScheduleKind::interleaved;
  REQUIRE(interleaved.microbatches() == 4);
  CHECK(walked(interleaved, 0, false, quarters) == Approx(5.0));
  CHECK(walked(interleaved, 0, true, quarters) == Approx(5.25));
  CHECK(walked(interleaved, 1, false, quarters) == Approx(3.0));
  CHECK(walked(interleaved, 1, true, quarters) == Approx(3.25));

  // The memory model on a model: one layer's activations more. The engine's own allocations, as the sim
  // backend runs it, grow by no more than that.
  const ModelSpec m = two_layer_moe();
  const Plan off = plan(4, false), on = plan(4, true);
  const double one_layer = layer_activation_bytes(m, on, meshtrain_layout(on));
  CHECK(rank_memory(m, on, 0).activations == Approx(rank_memory(m, off, 0).activations + one_layer));
  const SimulationResult a = run(m, off), b = run(m, on);
  CHECK(b.peak_memory_bytes >= a.peak_memory_bytes);
  CHECK(static_cast<double>(b.peak_memory_bytes) <= static_cast<double>(a.peak_memory_bytes) + one_layer);
}

TEST_CASE("EP all-to-all overlap is refused where Megatron-Core refuses it, naming the fix",
          "[sim_backend][moe][a2a_overlap]") {
  const ModelSpec m = two_layer_moe();
  auto refused = [&](Plan p, const std::string& part) {
    const Status s = validate_plan(p, m, p.world_size());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains(part));
  };
  Plan p = plan(4, true);
  p.ep = 1;
  refused(p, "needs expert parallelism, got ep 1");
  p = plan(4, true);
  p.pp = 2, p.dp = 8, p.ep = 8;
  refused(p, "needs the interleaved schedule");
  p.schedule = ScheduleKind::zb_h1;
  refused(p, "needs the 1f1b or interleaved schedule, got zb-h1");
  p = plan(4, true);
  p.recompute = Recompute::full;
  refused(p, "does not combine with recompute full");
  p = plan(4, true);
  p.zero = 3;
  refused(p, "needs zero 0, 1 or 2, got zero 3");
  Plan dense = plan(4, true);
  dense.ep = 1, dense.seq_len = 256;
  const Status s = validate_plan(dense, small_gpt(), dense.world_size());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("given for a dense model 'gpt2-124m'"));
}
