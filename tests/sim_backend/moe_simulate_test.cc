// Mixture of experts in the simulator: the dispatch all-to-alls run on the
// topology (an EP group across nodes pays the network, one inside a node
// NVLink), skewed routing makes the step wait for the busiest expert rank,
// the report carries all-to-all time, its exposed share and tokens per
// expert, and every MoE preset simulates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/simulation/simulation.h"
#include "simulator/cost_model.h"

using namespace meshtrain;

namespace {

// A small Mixtral-like model: 4 layers of 8 experts, d_model 1024.
ModelSpec small_moe() {
  ModelSpec m = *model_preset("moe-seed");
  m.name = "moe-small";
  m.layers = 4, m.hidden = 1024, m.heads = 8, m.kv_heads = 8, m.ffn = 2816;
  return m;
}

Plan moe_plan(const ModelSpec& m, int tp, int pp, int dp, int ep) {
  Plan p;
  p.tp = tp, p.pp = pp, p.dp = dp, p.ep = ep;
  p.micro_batch = 1;
  p.global_batch = dp * 4;
  p.seq_len = 2048;
  const Status valid = validate_plan(p, m, p.world_size());
  INFO((valid.ok() ? std::string() : valid.error().message()));
  REQUIRE(valid.ok());
  return p;
}

SimulationResult simulate(const ModelSpec& m, const Plan& p, const std::string& routing = "uniform",
                          const std::string& cluster = "dgx-h100", const std::string& dispatcher = "alltoall",
                          const sim::Calibration* calibration = nullptr) {
  SimulateOptions o;
  o.moe_dispatcher = dispatcher;
  o.calibration = calibration;
  auto spec = sim::cluster_preset(cluster);
  REQUIRE(spec.ok());
  o.cluster = *spec;
  auto r = MoeRouting::parse(routing);
  REQUIRE(r.ok());
  o.moe_routing = *r;
  auto result = simulate_iteration(m, p, o);
  INFO((result.ok() ? std::string() : result.error().message()));
  REQUIRE(result.ok());
  return std::move(result).value();
}

double all_to_all_per_call(const SimulationResult& r) {
  const auto& a = r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllToAll)];
  REQUIRE(a.count > 0);
  return a.time_s / static_cast<double>(a.count);
}

}  // namespace

TEST_CASE("an EP group across nodes pays the network, inside a node NVLink", "[sim][moe]") {
  const ModelSpec m = small_moe();
  // Every rank sends the same rows either way (its tokens · top_k); ep 8 on
  // one DGX H100 goes over NVSwitch, ep 16 over two nodes sends half its
  // rows through the NICs (50 GB/s each against 450 GB/s of NVLink).
  ModelSpec sixteen = m;
  sixteen.experts = 16;
  const SimulationResult node = simulate(sixteen, moe_plan(sixteen, 1, 1, 8, 8));
  const SimulationResult two = simulate(sixteen, moe_plan(sixteen, 1, 1, 16, 16));
  CHECK(all_to_all_per_call(two) > 3 * all_to_all_per_call(node));
  REQUIRE(node.moe.has_value());
  CHECK(node.moe->all_to_all_s > 0);
  CHECK(node.moe->all_to_all_exposed_s == node.moe->all_to_all_s);
  CHECK(two.moe->all_to_all_share > node.moe->all_to_all_share);
  CHECK(two.iteration_s > node.iteration_s);
}

TEST_CASE("a deduplicated dispatch is timed by its model, with or without a calibration of all-to-all",
          "[sim][moe]") {
  ModelSpec m = small_moe();
  m.experts = 16;
  m.top_k = 4;
  const Plan p = moe_plan(m, 1, 1, 16, 16);  // two DGX H100 nodes
  // A calibration that measured NCCL's all-to-all at 10 GB/s of bus bandwidth on 16 ranks.
  sim::Calibration slow;
  slow.collectives = {{sim::CollectiveKind::kAllToAll, 16, 1e6, 10, "", {}},
                      {sim::CollectiveKind::kAllToAll, 16, 1e9, 10, "", {}}};
  const double plain = all_to_all_per_call(simulate(m, p));
  const double measured = all_to_all_per_call(simulate(m, p, "uniform", "dgx-h100", "alltoall", &slow));
  const double dedup = all_to_all_per_call(simulate(m, p, "uniform", "dgx-h100", "deepep"));
  const double dedup_calibrated = all_to_all_per_call(simulate(m, p, "uniform", "dgx-h100", "deepep", &slow));
  CHECK(measured > plain);      // the plain all-to-all takes the measured bandwidth
  // Top-4 of 16 experts on 2 nodes: a token's rows cross to the other node
  // once (0.96 of the time), not twice on average.
  CHECK(dedup < plain);
  // Half the all-to-alls are each layer's i32 row counts, plain, which take the calibration (a few bytes:
  // cheaper than the model's latency); the token rows keep the dispatcher's model, which nccl-tests did not
  // measure. Taking the calibration, they would cost what the calibrated plain all-to-all does.
  CHECK(dedup_calibrated <= dedup);
  CHECK(dedup_calibrated < 0.5 * measured);
}

TEST_CASE("full fidelity simulates expert parallelism narrower than data parallelism", "[sim][moe]") {
  ModelSpec m = small_moe();
  m.experts = 16;
  // ep 8 of dp 16: two expert groups, ranks 0-7 and 8-15. A replica shifted along dp would meet in {1..8},
  // which is no group: every rank runs as its own representative instead (it used to deadlock).
  const Plan p = moe_plan(m, 1, 1, 16, 8);
  SimulateOptions o;
  o.cluster = *sim::cluster_preset("dgx-h100");
  const SimulationResult representative = simulate(m, p);
  o.fidelity = Fidelity::full;
  auto full = simulate_iteration(m, p, o);
  INFO((full.ok() ? std::string() : full.error().message()));
  REQUIRE(full.ok());
  CHECK(full->stages.size() == 16);
  for (const StageResult& s : full->stages) CHECK(s.ranks == 1);
  // The same ops on every rank: full and representative agree but for the NICs the two groups share.
  CHECK(full->iteration_s == Approx(representative.iteration_s).epsilon(0.1));
  REQUIRE(full->moe.has_value());
  CHECK(full->moe->all_to_all_s == Approx(representative.moe->all_to_all_s).epsilon(0.3));
}

TEST_CASE("skewed routing makes the step wait for the most loaded expert rank", "[sim][moe]") {
  const ModelSpec m = small_moe();
  const Plan p = moe_plan(m, 1, 1, 8, 4);
  const SimulationResult uniform = simulate(m, p);
  const SimulationResult zipf = simulate(m, p, "zipf:1.2");
  CHECK(uniform.moe->load_max_over_mean == Approx(1.0));
  CHECK(uniform.moe->busiest_rank_load == Approx(1.0));
  // zipf 1.2 over 8 experts: expert 0 takes 1/H = 42.9% of the assignments
  // (H = Σ_{e=1..8} e^-1.2); EP rank 0 (experts 0 and 1) 61.5%.
  CHECK(zipf.moe->load_max_over_mean == Approx(8 * 0.42863).epsilon(1e-4));
  CHECK(zipf.moe->busiest_rank_load == Approx(4 * 0.61520).epsilon(1e-4));
  CHECK(zipf.iteration_s > 1.3 * uniform.iteration_s);
  CHECK(zipf.peak_memory_bytes > uniform.peak_memory_bytes);
  // Tokens per expert: global batch · seq · top_k split by the shares.
  double sum = 0;
  for (double t : uniform.moe->tokens_per_expert.front()) sum += t;
  CHECK(sum == Approx(32.0 * 2048 * 2));
  CHECK(uniform.moe->tokens_per_expert.size() == 4);
}

TEST_CASE("a routing file gives shares per expert, a wrong one is refused naming the counts", "[sim][moe]") {
  const ModelSpec m = small_moe();
  const std::string path = "moe_simulate_routing.json";
  std::ofstream(path) << "[4, 1, 1, 1, 1, 1, 1, 1]";
  const SimulationResult r = simulate(m, moe_plan(m, 1, 1, 8, 8), "file:" + path);
  CHECK(r.moe->load_max_over_mean == Approx(8 * 4.0 / 11));
  std::ofstream(path) << "[1, 1, 1]";
  SimulateOptions o;
  o.cluster = *sim::cluster_preset("dgx-h100");
  o.moe_routing = *MoeRouting::parse("file:" + path);
  auto bad = simulate_iteration(m, moe_plan(m, 1, 1, 8, 8), o);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("holds 3 shares, the model has 8 experts"));
  std::remove(path.c_str());
}

namespace {

// The compute-stream durations (µs) of the ops named `name` on the first rank of a trace, in start order.
std::vector<double> durations_of(const std::string& trace, const std::string& name) {
  const nlohmann::json t = nlohmann::json::parse(trace);
  int pid0 = -1;
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X" && pid0 < 0) pid0 = e.at("pid").get<int>();
  std::vector<std::pair<double, double>> found;  // (start, duration)
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("pid").get<int>() == pid0 && e.at("name") == name)
      found.emplace_back(e.at("ts").get<double>(), e.at("dur").get<double>());
  std::sort(found.begin(), found.end());
  std::vector<double> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace

TEST_CASE("dropless uneven routing: the busiest EP rank's expert rows set every rank's grouped GEMMs",
          "[sim][moe]") {
  // 8 experts over ep 4 (2 local experts per rank), top 2, one micro-batch of 2048 tokens per rank: 4096
  // assignments. Shares 6:2:2:2:1:1:1:1 of 16 route 1536, 512, 512, 512 and 256 to each of the rest; EP
  // rank 0 (experts 0 and 1) is the busiest, and receives from each of its 4 peers (who route alike)
  // 1536 and 512 rows: its grouped GEMMs run groups of {6144, 2048} rows, where uniform routing gives
  // {2048, 2048}.
  const ModelSpec m = small_moe();
  Plan p = moe_plan(m, 1, 1, 4, 4);
  p.global_batch = 4;
  const std::string path = "moe_simulate_busiest.json";
  auto run = [&](const std::string& shares) {
    std::ofstream(path) << shares;
    SimulateOptions o;
    o.cluster = *sim::cluster_preset("dgx-h100");
    o.moe_routing = *MoeRouting::parse("file:" + path);
    o.trace = true;
    auto r = simulate_iteration(m, p, o);
    REQUIRE(r.ok());
    return std::move(r).value();
  };
  const SimulationResult skewed = run("[6, 2, 2, 2, 1, 1, 1, 1]");
  const SimulationResult uniform = run("[1, 1, 1, 1, 1, 1, 1, 1]");
  // The same loads with EP rank 1 the busiest (experts 2 and 3).
  const SimulationResult moved = run("[1, 1, 6, 2, 2, 2, 1, 1]");
  std::remove(path.c_str());
  const sim::CostModel cost(sim::cluster_preset("dgx-h100")->device, sim::CostConstants{});
  const std::int64_t C = m.hidden, F = m.ffn;
  // The first MoE layer's forward: the SwiGLU up projection (n = 2F, k = C), then the down projection.
  auto expected_us = [&](std::vector<std::int64_t> rows, std::int64_t n, std::int64_t k) {
    return sim::to_seconds(cost.grouped_gemm(rows, n, k, sim::DType::kBf16)) * 1e6;
  };
  const std::vector<double> got = durations_of(skewed.trace_json, "grouped_gemm");
  REQUIRE(got.size() >= 2);
  CHECK(got[0] == Approx(expected_us({6144, 2048}, 2 * F, C)).epsilon(1e-6));
  CHECK(got[1] == Approx(expected_us({6144, 2048}, C, F)).epsilon(1e-6));
  const std::vector<double> even = durations_of(uniform.trace_json, "grouped_gemm");
  REQUIRE(even.size() >= 1);
  CHECK(even[0] == Approx(expected_us({2048, 2048}, 2 * F, C)).epsilon(1e-6));
  // Every rank waits for the busiest: which rank it is does not change the step.
  CHECK(durations_of(moved.trace_json, "grouped_gemm") == got);
  CHECK(moved.iteration_s == Approx(skewed.iteration_s).epsilon(1e-3));
  CHECK(skewed.iteration_s > uniform.iteration_s);
}

TEST_CASE("every MoE preset simulates with expert, tensor and pipeline parallelism", "[sim][moe]") {
  struct Row {
    const char* model;
    int tp, pp, dp, ep;
  };
  for (Row row : {Row{"mixtral-8x7b", 1, 4, 16, 8}, Row{"mixtral-8x22b", 2, 8, 8, 8}, Row{"qwen3-30b-a3b", 1, 2, 32, 8},
                  Row{"moe-seed", 2, 1, 4, 2}}) {
    INFO(row.model);
    const ModelSpec m = *model_preset(row.model);
    Plan p = moe_plan(m, row.tp, row.pp, row.dp, row.ep);
    p.recompute = Recompute::full;
    p.zero = 1;
    p.global_batch = row.dp * 8;
    const SimulationResult r = simulate(m, p);
    CHECK(r.mfu > 0.05);
    CHECK(r.mfu < 0.8);
    CHECK(r.moe->all_to_all_s > 0);
  }
}

TEST_CASE("fp8: the routed experts' grouped GEMMs cast their operands as Transformer Engine does", "[sim][moe][fp8]") {
  // 8 experts over ep 4 (2 local experts per rank), top 2, uniform routing: each rank's experts
  // receive M = 4 · 1280 · 2 · 2 / 8 = 2560 rows per micro-batch of 1280 tokens, two micro-batches a
  // step. (1280 tokens keep every cast size below apart from the attention's.)
  const ModelSpec m = small_moe();
  Plan p = moe_plan(m, 1, 1, 4, 4);
  p.global_batch = 8;
  p.seq_len = 1280;
  auto run = [&](Precision precision) {
    p.precision = precision;
    SimulateOptions o;
    o.cluster = *sim::cluster_preset("dgx-h100");
    o.moe_routing = *MoeRouting::parse("uniform");
    o.trace = true;
    auto r = simulate_iteration(m, p, o);
    REQUIRE(r.ok());
    return std::move(r).value();
  };
  CHECK(durations_of(run(Precision::bf16).trace_json, "fp8_cast").empty());
  const std::vector<double> casts = durations_of(run(Precision::fp8).trace_json, "fp8_cast");
  const sim::CostModel cost(sim::cluster_preset("dgx-h100")->device, sim::CostConstants{});
  // A cast of n bf16 elements reads 2 bytes and writes the FP8 value and its transpose, 1 + 1.
  auto cast_us = [&](std::int64_t n) {
    return sim::to_seconds(cost.memory_bound(4.0 * static_cast<double>(n) + 8, "fp8_cast")) * 1e6;
  };
  auto count = [&](std::int64_t n) {
    return std::count_if(casts.begin(), casts.end(), [&](double d) { return d == Approx(cast_us(n)).epsilon(1e-9); });
  };
  const std::int64_t M = 2560, C = m.hidden, F = m.ffn, El = 2;
  // Per layer and step: each weight once (up (El, C, 2F), down (El, F, C)); per micro-batch the up
  // GEMM's input (M, C), the down GEMM's (M, F), and in backward the down output's gradient (M, C) and
  // the up output's (M, 2F). The backward GEMMs read the forward's input and weight casts.
  const auto weights = count(El * C * 2 * F);
  REQUIRE(weights > 0);
  CHECK(weights % m.layers == 0);
  CHECK(count(El * F * C) == weights);
  CHECK(count(M * C) == 2 * 2 * weights);  // the up input and the down gradient, two micro-batches
  CHECK(count(M * F) == 2 * weights);
  CHECK(count(M * 2 * F) == 2 * weights);
}
