// Precision fp8 through StepEngine on sim backends: the linear layers' GEMMs
// (and only they) cost at the device's FP8 peak, their operands' FP8 casts
// cost what Transformer Engine's cast kernels move, and the peak memory adds
// each FP8 linear's weight cast with its transpose less one byte of each
// saved GEMM input (FP8 parameters: the bf16 run's weight bytes). The
// expected figures are derived here from the model's shapes, not read back
// from the code under test.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "simulator/cost_model.h"
#include "tests/segmented_plan.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

// One rank, one micro-batch of 2 sequences: every GEMM of the step is issued once.
Plan one_rank(Precision precision) {
  Plan p;
  p.micro_batch = 2;
  p.precision = precision;
  return p;
}

sim::ClusterSpec h100() { return preset("dgx-h100"); }

// GPT-2 small (small_gpt) at 2 sequences of 256 per micro-batch: its 12 layers' four linear layers
// (in -> out: qkv, attention projection, MLP up and down) and the rows each micro-batch feeds them.
constexpr std::int64_t kRows = 2 * 256, kWidth = 768, kLayers = 12;
constexpr std::int64_t kLinears[4][2] = {{kWidth, 3 * kWidth}, {kWidth, kWidth}, {kWidth, 4 * kWidth}, {4 * kWidth, kWidth}};

// Σ over a step's FP8 casts of `cost`(elements): per micro-batch each linear's input (rows, in) and
// output gradient (rows, out), per step its weight (in, out); the backward GEMMs read the forward's.
double per_step_casts(int microbatches, const std::function<double(std::int64_t)>& cost) {
  double total = 0;
  for (const auto& [in, out] : kLinears) total += microbatches * (cost(kRows * in) + cost(kRows * out)) + cost(in * out);
  return total * kLayers;
}

double seconds(sim::Time t) { return sim::to_seconds(t); }

// The FP8 linears' weights (is_fp8_linear): each layer's four matrices; not their biases, the norms,
// the embeddings or the head. 12 · 12 · 768² = 84,934,656.
double fp8_weights() {
  double n = 0;
  for (const auto& [in, out] : kLinears) n += static_cast<double>(in * out);
  return n * kLayers;
}

// Delayed scaling's step amax of `layers` layers, 3 f32 for each of their 4 linears: zeroed as the
// step begins and once folded, copied into the buffer the reduction reads (one rank: no collective).
double step_amax_s(const sim::CostModel& cost, std::int64_t layers = kLayers) {
  const double bytes = 4.0 * 3 * 4 * static_cast<double>(layers);
  return 2 * seconds(cost.memory_bound(bytes, "fill")) + seconds(cost.memory_bound(2 * bytes, "copy"));
}

Result<SimulationResult> simulate(const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  SimulateOptions o;
  o.cluster = c;
  return simulate_iteration(m, p, o);
}

SimulationResult simulated(const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  SimulateOptions o;
  o.cluster = c;
  return sim_testing::simulated(m, p, o);
}

}  // namespace

TEST_CASE("fp8: the compute time changes by exactly the linear layers' GEMMs and their operands' casts",
          "[sim_backend][fp8]") {
  const ModelSpec m = small_gpt();
  const sim::ClusterSpec c = h100();
  const sim::CostModel cost(c.device, sim::CostConstants{});
  const std::int64_t rows = kRows, layers = kLayers;
  // One cast of n bf16 elements: read 2 bytes, write the FP8 value and its transpose (1 + 1), and
  // read and write the f32 amax.
  auto cast = [&](std::int64_t n) { return seconds(cost.memory_bound(4.0 * static_cast<double>(n) + 8, "fp8_cast")); };
  for (const int microbatches : {1, 2}) {
    Plan bf16_plan = one_rank(Precision::bf16);
    bf16_plan.global_batch = 2 * microbatches;
    Plan fp8_plan = bf16_plan;
    fp8_plan.precision = Precision::fp8;
    const double bf16 = simulated(m, bf16_plan, c).stages.at(0).compute_s;
    const double fp8 = simulated(m, fp8_plan, c).stages.at(0).compute_s;
    // Each micro-batch runs, per linear, a forward GEMM (rows, out, in), an input-gradient GEMM
    // (rows, in, out) and a weight-gradient GEMM (in, out, rows), as (m, n, k), at FP8 instead of
    // bf16; the output layer (a vocabulary dimension) stays bf16. Each micro-batch casts the
    // linear's input (rows, in) and its output gradient (rows, out); the weight (in, out) is cast
    // once a step, and the backward GEMMs read the forward's casts.
    double expected = 0;
    for (const auto& [in, out] : kLinears)
      for (const auto& [gm, gn, gk] : {std::array{rows, out, in}, std::array{rows, in, out}, std::array{in, out, rows}})
        expected += microbatches * (seconds(cost.gemm(gm, gn, gk, sim::DType::kBf16)) -
                                    seconds(cost.gemm(gm, gn, gk, sim::DType::kFp8)));
    expected = expected * layers - per_step_casts(microbatches, cast) - step_amax_s(cost);
    INFO(microbatches << " micro-batches: bf16 " << bf16 << " s, fp8 " << fp8 << " s, expected saving " << expected
                      << " s");
    // At 512 rows of width 768 the GEMMs are far from the FP8 peak and the casts cost more than
    // FP8 saves (it pays for large GEMMs only): fp8 is slower here, by a measurable share.
    CHECK(-expected > 0.02 * bf16);
    CHECK(bf16 - fp8 == Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE("fp8 current scaling costs delayed scaling's step plus an amax pass before every cast made",
          "[sim_backend][fp8][current]") {
  const ModelSpec m = small_gpt();
  const sim::ClusterSpec c = h100();
  const sim::CostModel cost(c.device, sim::CostConstants{});
  // Before a cast of n bf16 elements: its amax zeroed (one f32 written), then the pass that reads
  // the n elements and reads and writes the amax. One rank: no reduction to run.
  auto pass = [&](std::int64_t n) {
    return seconds(cost.memory_bound(4, "fill")) + seconds(cost.memory_bound(2.0 * static_cast<double>(n) + 8, "amax"));
  };
  for (const int microbatches : {1, 2}) {
    Plan delayed = one_rank(Precision::fp8);
    delayed.global_batch = 2 * microbatches;
    Plan current = delayed;
    current.fp8_recipe = Fp8Recipe::current;
    const double t_delayed = simulated(m, delayed, c).stages.at(0).compute_s;
    const double t_current = simulated(m, current, c).stages.at(0).compute_s;
    // The casts made are delayed scaling's: per micro-batch a linear's input and output gradient,
    // per step its weight. Delayed scaling's step amax is not kept.
    const double expected = per_step_casts(microbatches, pass) - step_amax_s(cost);
    INFO(microbatches << " micro-batches: delayed " << t_delayed << " s, current " << t_current << " s");
    CHECK(expected > 0.01 * t_delayed);
    CHECK(t_current - t_delayed == Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE("fp8 current scaling: the sim reduces the amax where Transformer Engine does, before its FP8 gathers",
          "[sim_backend][fp8][current]") {
  // tp 2 with sequence parallelism, 2 micro-batches: per micro-batch and layer TE casts four tensors
  // before an FP8 gather and all-reduces their amax over tp: the two column-parallel inputs (qkv, MLP
  // up) and the two row-parallel output gradients (attention out, MLP down). The weights, the
  // row-parallel inputs and the column-parallel gradients, which the cpu emulation also reduces for
  // the single-rank amax, keep their shard's amax in a Transformer Engine run: no collective.
  const ModelSpec m = small_gpt();
  Plan delayed = one_rank(Precision::fp8);
  delayed.tp = 2, delayed.sequence_parallel = true, delayed.global_batch = 4;
  Plan current = delayed;
  current.fp8_recipe = Fp8Recipe::current;
  const auto all_reduces = [&](const Plan& p) {
    return simulated(m, p, h100()).collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllReduce)].count;
  };
  // Delayed scaling's one step-end reduction of the step amax over tp is gone.
  const std::uint64_t layers = 12, microbatches = 2;
  CHECK(all_reduces(current) - all_reduces(delayed) == 4 * layers * microbatches - 1);
}

TEST_CASE("fp8: peak memory adds the FP8 linears' weight casts and saves a byte per saved GEMM input",
          "[sim_backend][fp8][memory]") {
  const ModelSpec m = small_gpt();
  const SimulationResult bf16 = simulated(m, one_rank(Precision::bf16), h100());
  const SimulationResult fp8 = simulated(m, one_rank(Precision::fp8), h100());
  const double params = static_cast<double>(bf16.stages.at(0).model.parameter_count);
  REQUIRE(fp8_weights() == 84934656.0);
  // Saved GEMM inputs per layer, in units of rows·h: the two norms' outputs (2), the attention
  // output (1) and the MLP's second input (4); one micro-batch in flight, 12 layers.
  const double gemm_inputs = 12 * 7.0 * 2 * 256 * 768;
  // Each FP8 linear's weight is kept cast with its transpose (2 bytes) over the step.
  const double extra = fp8_weights() * 2 - gemm_inputs * 1;
  CHECK(static_cast<double>(fp8.stages.at(0).peak_bytes - bf16.stages.at(0).peak_bytes) == Approx(extra).margin(1));
  CHECK(fp8.stages.at(0).model.total() - bf16.stages.at(0).model.total() == Approx(extra).margin(1));
  // bf16 2 bytes per parameter and the casts' 2 per FP8 weight; fp32 gradients 4; master and AdamW moments 12.
  CHECK(fp8.stages.at(0).model.parameters == Approx(2 * params + 2 * fp8_weights()));
  CHECK(fp8.stages.at(0).model.gradients == Approx(4 * params));
  CHECK(fp8.stages.at(0).model.optimizer == Approx(12 * params));
}

TEST_CASE("fp8: every pipeline stage's peak adds exactly what the memory model adds, under 1F1B and ZB-H1",
          "[sim_backend][fp8][memory]") {
  // The casts are costed, not held: on the sim a cast's output is its input, so the peak of every
  // stage moves by the memory model's FP8 figure alone (its FP8 weight copies less a byte per saved
  // GEMM input), even where the schedule holds inputs and gradients for a deferred weight pass.
  const ModelSpec m = small_gpt();
  for (const ScheduleKind schedule : {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
    Plan bf16 = one_rank(Precision::bf16);
    bf16.pp = 4, bf16.tp = 2, bf16.sequence_parallel = true, bf16.schedule = schedule;
    bf16.global_batch = 16;
    Plan fp8 = bf16;
    fp8.precision = Precision::fp8;
    const SimulationResult a = simulated(m, bf16, h100()), b = simulated(m, fp8, h100());
    REQUIRE(a.stages.size() == 4);
    for (std::size_t s = 0; s < a.stages.size(); ++s) {
      INFO("stage " << s << (schedule == ScheduleKind::zb_h1 ? " zb-h1" : " 1f1b"));
      // Up to the step's amax, 3 f32 for each of the stage's FP8 linears (3 layers of 4), which the
      // memory model leaves out; a held bf16 cast of one activation would be megabytes.
      const double amax = 3 * 4 * 3 * 4.0;
      CHECK(static_cast<double>(b.stages[s].peak_bytes - a.stages[s].peak_bytes) ==
            Approx(b.stages[s].model.total() - a.stages[s].model.total()).margin(amax));
    }
  }
}

TEST_CASE("fp8: a plan made of segments changes compute and peak as the uniform plan does, less one amax per segment",
          "[sim_backend][fp8][segments]") {
  // The same rank runs the same GEMMs and casts whether its layers form one segment or two; what
  // differs is the step's amax bookkeeping, which each segment does for its own linears. (A tied
  // embedding and head would have to share a segment.)
  ModelSpec m = small_gpt();
  m.tied_embeddings = false;
  const sim::ClusterSpec c = h100();
  const sim::CostModel cost(c.device, sim::CostConstants{});
  auto with_segments = [&](Precision precision) {
    return testing::segmented(m, one_rank(precision), R"([{"blocks": [0, 6]}, {"blocks": [7, 13]}])");
  };
  const SimulationResult uniform_bf16 = simulated(m, one_rank(Precision::bf16), c);
  const SimulationResult uniform_fp8 = simulated(m, one_rank(Precision::fp8), c);
  const SimulationResult split_bf16 = simulated(m, with_segments(Precision::bf16), c);
  const SimulationResult split_fp8 = simulated(m, with_segments(Precision::fp8), c);
  REQUIRE(split_fp8.stages.size() == 1);
  // The step amax's bookkeeping for the 12 layers at once, or for 6 and 6.
  const double uniform_change = uniform_fp8.stages[0].compute_s - uniform_bf16.stages[0].compute_s;
  const double split_change = split_fp8.stages[0].compute_s - split_bf16.stages[0].compute_s;
  CHECK(split_change == Approx(uniform_change + 2 * step_amax_s(cost, 6) - step_amax_s(cost, 12)).epsilon(1e-6));
  // Each segment's FP8 weight copies and 1-byte saved inputs: the whole model's, summed.
  CHECK(split_fp8.stages[0].peak_bytes - split_bf16.stages[0].peak_bytes ==
        uniform_fp8.stages[0].peak_bytes - uniform_bf16.stages[0].peak_bytes);
}

TEST_CASE("fp8: refused on a device without FP8 units, naming it", "[sim_backend][fp8]") {
  const ModelSpec m = small_gpt();
  auto a100 = sim::cluster_preset("dgx-a100");
  REQUIRE(a100.ok());
  auto r = simulate(m, one_rank(Precision::fp8), *a100);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message(), Catch::Contains("A100-SXM4-80GB") && Catch::Contains("FP8") &&
                                      Catch::Contains("--precision bf16"));
  CHECK(simulate(m, one_rank(Precision::bf16), *a100).ok());
}

TEST_CASE("fp8: the precision's name parses and prints", "[sim_backend][fp8]") {
  auto p = parse_precision("fp8");
  REQUIRE(p.ok());
  CHECK(*p == Precision::fp8);
  CHECK(precision_name(Precision::fp8) == "fp8");
  CHECK(element_bytes(Precision::fp8) == 2);  // the working weights stay bf16
}

TEST_CASE("fp8: the FP8 operands Transformer Engine gathers under sequence parallelism cross tp at one byte",
          "[sim_backend][fp8]") {
  // tp 2 with SP, 2 micro-batches of 2 x 256 rows. Per layer and micro-batch TE gathers FP8 bytes: the two
  // column-parallel inputs (qkv, MLP up) in forward and again for their weight gradients, and, where the
  // layer has no bias (whose gradient reads the 16-bit rows), the two row-parallel output gradients
  // (attention out, MLP down). Each gather's nccl-tests size is the whole (rows, 768): the fp8 run moves
  // one byte of the bf16 run's two for each of them, everything else alike.
  const std::uint64_t layers = 12, microbatches = 2;
  const double gathered = static_cast<double>(kRows * kWidth);
  auto gather_bytes = [&](const ModelSpec& m, Precision precision, bool overlap, sim::CollectiveKind kind) {
    Plan p = one_rank(precision);
    p.tp = 2, p.sequence_parallel = true, p.global_batch = 4, p.tp_comm_overlap = overlap;
    return simulated(m, p, h100()).collectives[static_cast<std::size_t>(kind)].bytes;
  };
  using K = sim::CollectiveKind;
  ModelSpec biased = small_gpt(), unbiased = small_gpt();
  unbiased.bias = false;
  CHECK(gather_bytes(biased, Precision::bf16, false, K::kAllGather) -
            gather_bytes(biased, Precision::fp8, false, K::kAllGather) ==
        Approx(4.0 * layers * microbatches * gathered));
  CHECK(gather_bytes(unbiased, Precision::bf16, false, K::kAllGather) -
            gather_bytes(unbiased, Precision::fp8, false, K::kAllGather) ==
        Approx(6.0 * layers * microbatches * gathered));
  // tp-comm-overlap's forward gathers are ring steps (all-to-alls) of the FP8 shards: half the bytes.
  const double ring_bf16 = gather_bytes(unbiased, Precision::bf16, true, K::kAllToAll);
  REQUIRE(ring_bf16 > 0);
  CHECK(gather_bytes(unbiased, Precision::fp8, true, K::kAllToAll) == Approx(ring_bf16 / 2));
}

TEST_CASE("fp8 parameters (fp8_param_gather) hold the bf16 run's weight bytes and are all-gathered at one byte",
          "[sim_backend][fp8][memory]") {
  // dp 4 under ZeRO 1: each gradient bucket's parameters are all-gathered once a step. With FP8
  // parameters the FP8 linears' weights cross at one byte of the bf16 run's two: the step's gathers
  // (each counted once, at its nccl-tests size) move fp8_weights() bytes fewer; nothing else changes.
  const ModelSpec m = small_gpt();
  auto plan = [](bool fp8_params, int zero) {
    Plan p = one_rank(Precision::fp8);
    p.dp = 4, p.zero = zero, p.global_batch = 8, p.fp8_param_gather = fp8_params;
    return p;
  };
  Plan bf16 = plan(false, 1);
  bf16.precision = Precision::bf16;
  const SimulationResult casts = simulated(m, plan(false, 1), h100());
  const SimulationResult params = simulated(m, plan(true, 1), h100());
  const SimulationResult sixteen = simulated(m, bf16, h100());
  const auto gathered = [](const SimulationResult& r) {
    return r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllGather)].bytes;
  };
  REQUIRE(gathered(casts) > 0);
  CHECK(gathered(casts) - gathered(params) == Approx(fp8_weights()));
  CHECK(gathered(casts) == Approx(gathered(sixteen)));
  // The FP8 weight (with its transpose) is the parameter: the bf16 run's bytes, 2 per FP8 weight fewer
  // than the FP8 run that keeps both.
  CHECK(params.stages.at(0).model.parameters == Approx(sixteen.stages.at(0).model.parameters));
  CHECK(casts.stages.at(0).model.parameters - params.stages.at(0).model.parameters == Approx(2 * fp8_weights()));
  // ZeRO 3 gathers a layer's unit before each use: FP8 parameters shrink those too, and a rank's shards
  // of the FP8 weights are FP8 values, a byte each: the bf16 run's shard bytes less one per FP8 weight
  // over dp 4.
  const SimulationResult casts3 = simulated(m, plan(false, 3), h100());
  const SimulationResult params3 = simulated(m, plan(true, 3), h100());
  CHECK(gathered(params3) < gathered(casts3));
  bf16.zero = 3;
  CHECK(params3.stages.at(0).model.parameters ==
        Approx(simulated(m, bf16, h100()).stages.at(0).model.parameters - fp8_weights() / 4));
}

TEST_CASE("fp8 parameters are refused without precision fp8 or the distributed optimizer, naming the fix",
          "[sim_backend][fp8]") {
  Plan p = one_rank(Precision::bf16);
  p.dp = 2, p.zero = 1, p.global_batch = 4, p.fp8_param_gather = true;
  auto refusal = [&](const Plan& q) {
    const Status s = validate_plan(q, small_gpt());
    REQUIRE_FALSE(s.ok());
    return s.error().message();
  };
  CHECK_THAT(refusal(p), Catch::Contains("fp8_param_gather (--fp8-param-gather) needs precision fp8, got bf16") &&
                             Catch::Contains("--precision fp8"));
  p.precision = Precision::fp8, p.zero = 0;
  CHECK_THAT(refusal(p), Catch::Contains("needs the distributed optimizer") && Catch::Contains("--zero 1"));
  p.zero = 2;
  CHECK(validate_plan(p, small_gpt()).ok());
}

TEST_CASE("fp8 under ZeRO 3 casts each gathered weight at each use, forward and backward", "[sim_backend][fp8]") {
  // dp 2, 2 micro-batches: below ZeRO 3 a weight is cast once a step; under it twice a micro-batch (the
  // weight is gathered again for each pass, and Transformer Engine casts a re-gathered weight for its
  // backward too: as FSDP runs Transformer Engine, a weight re-gathered for a pass is quantized for it), so
  // 2·2 - 1 = 3 more casts of each FP8 weight; everything else FP8 changes is alike.
  const ModelSpec m = small_gpt();
  const sim::ClusterSpec c = h100();
  const sim::CostModel cost(c.device, sim::CostConstants{});
  double weights = 0;
  for (const auto& [in, out] : kLinears) weights += seconds(cost.memory_bound(4.0 * static_cast<double>(in * out) + 8, "fp8_cast"));
  for (const Recompute r : {Recompute::none, Recompute::full}) {
    auto compute = [&](Precision precision, int zero) {
      Plan p = one_rank(precision);
      p.dp = 2, p.zero = zero, p.global_batch = 8, p.recompute = r;
      return simulated(m, p, c).stages.at(0).compute_s;
    };
    const double change1 = compute(Precision::fp8, 1) - compute(Precision::bf16, 1);
    const double change3 = compute(Precision::fp8, 3) - compute(Precision::bf16, 3);
    // A full recomputation's forward gathers and casts once more: 3·2 - 1 = 5 more casts.
    const int more = r == Recompute::full ? 5 : 3;
    INFO(recompute_name(r));
    CHECK(change3 - change1 == Approx(more * weights * kLayers).epsilon(1e-6));
  }
}

TEST_CASE("fp8: the backward GEMMs cost as the split accumulator's, which a calibration measures apart",
          "[sim_backend][fp8]") {
  // Transformer Engine runs a linear's forward GEMM with the fast accumulator and its dgrad and wgrad with
  // the split one. Two calibrations with one FP8 GEMM each, so that every shape runs at that entry's
  // throughput: `same` has only the fast one (the split GEMMs then cost as fast ones), `slower` adds a
  // split entry at half the throughput. The step's compute differs by the backward GEMMs' FLOPs once
  // more at the fast throughput: per micro-batch and linear, dgrad (rows, in, out) and wgrad (in, out,
  // rows), 2·rows·in·out FLOPs each.
  const ModelSpec m = small_gpt();
  const sim::ClusterSpec c = h100();
  constexpr double kFastFlops = 800e12;
  const std::int64_t s = 4096;
  const double entry_us = 2.0 * s * s * s / kFastFlops * 1e6;
  sim::Calibration same;
  same.precision = sim::DType::kBf16;
  same.gemm = {{s, s, s, sim::DType::kFp8, entry_us}};
  sim::Calibration slower = same;
  slower.gemm.push_back({s, s, s, sim::DType::kFp8Split, 2 * entry_us});
  Plan p = one_rank(Precision::fp8);
  p.global_batch = 4;  // two micro-batches
  auto compute = [&](const sim::Calibration& cal) {
    SimulateOptions o;
    o.cluster = c;
    o.calibration = &cal;
    return sim_testing::simulated(m, p, o).stages.at(0).compute_s;
  };
  double backward_flops = 0;
  for (const auto& [in, out] : kLinears) backward_flops += 2 * (2.0 * kRows * in * out);
  backward_flops *= 2 * kLayers;  // micro-batches, layers
  CHECK(compute(slower) - compute(same) == Approx(backward_flops / kFastFlops).epsilon(1e-6));
}
