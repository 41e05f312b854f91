// One iteration through StepEngine on sim backends, checked against results
// derived independently of the simulator: the analytic memory model, the
// pipeline bubble of uniform stages, the 1F1B in-flight bound, determinism,
// representative-rank sharing, and the CLI's JSON.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/memory/memory_model.h"
#include "engine/simulation/simulation.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

sim::ClusterSpec a100() { return preset("dgx-a100"); }

Plan make_plan(const ModelSpec& m, int tp, int pp, int dp, int micro_batch, int microbatches, ScheduleKind s,
               Precision precision = Precision::bf16) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = micro_batch;
  p.global_batch = micro_batch * dp * microbatches;
  p.schedule = s;
  p.precision = precision;
  return checked(p, m);
}

SimulationResult simulate(const ModelSpec& m, const Plan& p, bool check_memory = true, bool trace = false) {
  SimulateOptions o;
  o.cluster = a100();
  o.check_memory = check_memory;
  o.trace = trace;
  return simulated(m, p, o);
}

// Wide layers and a tiny vocabulary: each stage's work is its transformer
// layers, and a micro-batch's compute (∝ tokens·h²·layers) dwarfs the
// activation it sends to the next stage (∝ tokens·h).
ModelSpec uniform_model() { return sim_testing::uniform_model(32, 2048, 16); }


}  // namespace

TEST_CASE("simulate: per-stage peak memory matches the analytic memory model", "[sim_backend][memory]") {
  const ModelSpec m = small_gpt();
  // fp32: the engine keeps fp32 values, so meshtrain's layout at fp32 describes what it allocates.
  for (ScheduleKind s : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    const Plan p = make_plan(m, 2, 2, 2, 2, 4, s, Precision::fp32);
    const SimulationResult r = simulate(m, p);
    REQUIRE(r.stages.size() == 2);
    for (const StageResult& st : r.stages) {
      INFO(schedule_name(s) << " stage " << st.stage << ": measured " << st.peak_bytes << " B, model "
                            << st.model.total() << " B (activations " << st.model.activations << ")");
      CHECK(static_cast<double>(st.peak_bytes) == Approx(st.model.total()).epsilon(0.10));
    }
  }
}

TEST_CASE("simulate: uniform stages idle (p-1)/(m+p-1) under GPipe and 1F1B", "[sim_backend][pipeline]") {
  // Derivation: with every stage taking f per forward and b per backward of
  // a micro-batch and no communication cost, the last micro-batch's backward
  // leaves stage 0 at (m + p - 1)(f + b) under either schedule (the warm-up
  // and cool-down each add (p - 1) slots), while each stage computes m(f + b):
  // idle / iteration = (p - 1)/(m + p - 1). The optimizer step (fixed per
  // iteration: fp32 masters, moments and the 16-bit copy) and the send/recv
  // of activations add a little to both. With 16-bit activations and 4
  // sequences per micro-batch the optimizer came to ~1.1% of the iteration;
  // 8 sequences halve its share, keeping both < 1% as the formula needs.
  const ModelSpec m = uniform_model();
  const int p = 4, mb = 8;
  const double expected = static_cast<double>(p - 1) / (mb + p - 1);
  for (ScheduleKind s : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    const SimulationResult r = simulate(m, make_plan(m, 1, p, 1, 8, mb, s), /*check_memory=*/false);
    INFO(schedule_name(s) << ": bubble " << r.bubble_fraction << ", expected " << expected);
    CHECK(r.bubble_fraction == Approx(expected).epsilon(0.01));
    for (const StageResult& st : r.stages) CHECK(st.idle_s / r.iteration_s == Approx(expected).epsilon(0.015));
  }
}

TEST_CASE("simulate: uniform stages idle (p-1)/(v·m+p-1) under the interleaved schedule", "[sim_backend][pipeline]") {
  // Derivation (engine/schedule/timing.h has it for the bare schedule): with
  // v chunks per stage, one micro-batch through one chunk takes f/v forward
  // and b/v backward. The last stage waits (p-1)·f/v for the first activation
  // to cross the pipe (each of the p-1 earlier stages runs chunk 0 of it
  // first); from then on Megatron's warm-up w = 2(p-r-1) + (v-1)p keeps it
  // supplied, so it runs its m·v forwards and backwards back to back; the
  // last gradient then needs (p-1)·b/v to drain back to stage 0. So
  //   T = (p-1)(f+b)/v + m(f+b),   idle / T = (p-1)/(v·m + p-1),
  // i.e. interleaving divides the bubble's length by v. The engine also
  // sends v times as many (smaller-per-compute) activations as 1F1B: here
  // still < 1% of the iteration.
  const ModelSpec m = uniform_model();
  const int p = 4, mb = 8;
  for (int v : {2, 4}) {
    const double expected = static_cast<double>(p - 1) / (v * mb + p - 1);
    Plan plan = make_plan(m, 1, p, 1, 4, mb, ScheduleKind::one_f_one_b);
    plan.schedule = ScheduleKind::interleaved;
    plan.vpp = v;
    REQUIRE(validate_plan(plan, m, plan.world_size()).ok());
    const SimulationResult r = simulate(m, plan, /*check_memory=*/false);
    INFO("vpp " << v << ": bubble " << r.bubble_fraction << ", expected " << expected << ", 1F1B would be "
                << static_cast<double>(p - 1) / (mb + p - 1));
    CHECK(r.bubble_fraction == Approx(expected).epsilon(0.01));
    for (const StageResult& st : r.stages) CHECK(st.idle_s / r.iteration_s == Approx(expected).epsilon(0.015));
  }
}

TEST_CASE("simulate: 1F1B holds p micro-batches of activations on the first stage", "[sim_backend][pipeline]") {
  // GPipe holds all m: its peak grows by one micro-batch's activations a per
  // extra micro-batch. 1F1B's first stage holds min(p, m), so for m = 2p its
  // peak is GPipe's at m = 1 plus (p - 1)·a.
  const ModelSpec m = small_gpt();
  const int p = 4;
  auto peak = [&](ScheduleKind s, int microbatches) {
    return static_cast<double>(
        simulate(m, make_plan(m, 1, p, 1, 2, microbatches, s, Precision::fp32), false).stages[0].peak_bytes);
  };
  const double g1 = peak(ScheduleKind::gpipe, 1), g2 = peak(ScheduleKind::gpipe, 2);
  const double a = g2 - g1;
  REQUIRE(a > 0);
  const double inflight = 1 + (peak(ScheduleKind::one_f_one_b, 2 * p) - g1) / a;
  CHECK(inflight == Approx(p).margin(0.05));
  // Beyond p, more micro-batches add only their token ids (uploaded at the start).
  CHECK(peak(ScheduleKind::one_f_one_b, 3 * p) == Approx(peak(ScheduleKind::one_f_one_b, 2 * p)).epsilon(1e-4));
}

TEST_CASE("simulate: the same input twice gives identical trace bytes", "[sim_backend]") {
  const ModelSpec m = small_gpt();
  const Plan p = make_plan(m, 2, 2, 2, 1, 4, ScheduleKind::one_f_one_b);
  const SimulationResult a = simulate(m, p, true, true), b = simulate(m, p, true, true);
  REQUIRE(a.trace_json.size() > 1000);
  CHECK(a.trace_json == b.trace_json);
}

TEST_CASE("simulate: tasks do not grow with the data-parallel degree", "[sim_backend][scale]") {
  // 8, 1024 and 1,048,576 GPUs with the same tp and pp: one representative
  // per stage issues the same ops; only the analytic dp collectives get
  // longer. (The million-GPU mesh lists no groups and its collectives route
  // each ring once: engine/plan/mesh.h, sim::StepCosts.)
  const ModelSpec m = small_gpt();
  const SimulationResult small = simulate(m, make_plan(m, 2, 2, 2, 1, 4, ScheduleKind::one_f_one_b));
  const SimulationResult large = simulate(m, make_plan(m, 2, 2, 256, 1, 4, ScheduleKind::one_f_one_b));
  const SimulationResult huge = simulate(m, make_plan(m, 2, 2, 262144, 1, 4, ScheduleKind::one_f_one_b));
  CHECK(small.tasks == large.tasks);
  CHECK(huge.tasks == small.tasks);
  CHECK(huge.events == large.events);
  CHECK(small.stages.size() == large.stages.size());
  CHECK(large.iteration_s > small.iteration_s);
  CHECK(huge.iteration_s > large.iteration_s);
}

TEST_CASE("simulate: a plan that does not fit names the rank and the breakdown", "[sim_backend][memory]") {
  auto m = model_preset("gpt3-175b");
  REQUIRE(m.ok());
  Plan p;
  p.tp = 8;
  p.pp = 2;
  p.micro_batch = 1;
  p.global_batch = 2;
  REQUIRE(validate_plan(p, *m, 16).ok());
  SimulateOptions o;
  o.cluster = a100();
  auto r = simulate_iteration(*m, p, o);
  REQUIRE_FALSE(r.ok());
  const std::string& msg = r.error().message();
  INFO(msg);
  CHECK(msg.find("out of memory: rank 0 (pipeline stage 0") != std::string::npos);
  CHECK(msg.find("optimizer") != std::string::npos);
  CHECK(msg.find("activations") != std::string::npos);
}

TEST_CASE("meshtrain simulate --json: fields present and sane", "[sim_backend][cli]") {
  std::FILE* pipe = popen(MESHTRAIN_BINARY " simulate --json", "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  REQUIRE(pclose(pipe) == 0);
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* key : {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction",
                          "peak_memory_bytes", "collectives", "exposed_comm_s"})
    CHECK(j.contains(key));
  CHECK(j["iteration_time_s"].get<double>() > 0);
  CHECK(j["tokens_per_s"].get<double>() > 0);
  CHECK(j["tflops_per_gpu"].get<double>() <= 312.0);  // A100 dense bf16 peak
  CHECK(j["mfu"].get<double>() > 0);
  CHECK(j["mfu"].get<double>() < 1);
  CHECK(j["bubble_fraction"].get<double>() >= 0);
  CHECK(j["bubble_fraction"].get<double>() < 1);
  CHECK(j["peak_memory_bytes"].get<double>() > 0);
  CHECK(j["peak_memory_bytes"].get<double>() <= j["device_memory_bytes"].get<double>());
  CHECK(j["collectives"]["all_reduce"]["count"].get<int>() > 0);
  CHECK(j["collectives"]["send_recv"]["count"].get<int>() > 0);
}

TEST_CASE("simulate: uneven stages build their own layers, and memory per stage matches the model",
          "[sim_backend][memory][uneven]") {
  // 32 layers as 5 + 8 + 8 + 11 on four stages (Megatron-Core's first/last_stage_layers); the
  // tiny vocabulary leaves each stage's work to its layers, so compute follows the layer counts.
  const ModelSpec m = uniform_model();
  Plan p = make_plan(m, 1, 4, 1, 1, 4, ScheduleKind::one_f_one_b);
  p.first_stage_layers = 5, p.last_stage_layers = 11;
  REQUIRE(validate_plan(p, m, p.world_size()).ok());
  const SimulationResult r = simulate(m, p, /*check_memory=*/false);
  REQUIRE(r.stages.size() == 4);
  for (const StageResult& st : r.stages) {
    INFO("stage " << st.stage << ": measured " << st.peak_bytes << " B, model " << st.model.total() << " B");
    CHECK(static_cast<double>(st.peak_bytes) == Approx(st.model.total()).epsilon(0.10));
  }
  const int layers[4] = {5, 8, 8, 11};
  for (int s = 1; s < 4; ++s) {
    INFO("stage " << s << " compute " << r.stages[s].compute_s << " s vs stage 0 " << r.stages[0].compute_s);
    CHECK(r.stages[s].compute_s / r.stages[0].compute_s == Approx(layers[s] / 5.0).epsilon(0.05));
  }
}

TEST_CASE("simulate: dropout issues its kernels, and a probability of 1 is refused",
          "[sim_backend][dropout]") {
  const ModelSpec m = small_gpt();
  const Plan p = make_plan(m, 1, 1, 1, 2, 1, ScheduleKind::one_f_one_b);
  SimulateOptions o;
  o.cluster = a100();
  auto plain = simulate_iteration(m, p, o);
  o.kernels.dropout = 0.1f;
  auto dropped = simulate_iteration(m, p, o);
  REQUIRE(plain.ok());
  REQUIRE(dropped.ok());
  CHECK(dropped->stages[0].compute_s > plain->stages[0].compute_s);
  o.kernels.dropout = 1.f;
  auto bad = simulate_iteration(m, p, o);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("dropout"));
  CHECK_FALSE(attention_impl_from_name("fused").ok());
  CHECK(attention_impl_from_name("unfused").value() == AttentionImpl::unfused);
  CHECK(cross_entropy_impl_from_name("unfused").value() == CrossEntropyImpl::unfused);
  auto typo = cross_entropy_impl_from_name("flash");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(typo.error().message(), Catch::Contains("'flash'") && Catch::Contains("fused") && Catch::Contains("unfused"));
  // The unfused loss makes a step slower (eight passes over the logits, through an fp32 copy, in place of three).
  o.kernels.dropout = 0.f;
  o.kernels.cross_entropy = CrossEntropyImpl::unfused;
  auto unfused = simulate_iteration(m, p, o);
  REQUIRE(unfused.ok());
  CHECK(unfused->stages[0].compute_s > plain->stages[0].compute_s);
}

namespace {

nlohmann::json simulate_json(const std::string& args) {
  const std::string cmd = std::string(MESHTRAIN_BINARY) + " simulate --json " + args;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  INFO(cmd << "\n" << out);
  REQUIRE(pclose(pipe) == 0);
  return nlohmann::json::parse(out);
}

}  // namespace

TEST_CASE("simulate --json: a larger --grad-bucket-mb issues fewer data-parallel all-reduces",
          "[sim_backend][cli][buckets]") {
  // GPT-2 small's parameters, counted from its shape (tied embeddings, 1024
  // learned positions, biases): V·h + S·h + L·(12h² + 13h) + 2h = 124,439,808.
  const std::int64_t V = 50257, S = 1024, h = 768, L = 12;
  const std::int64_t params = V * h + S * h + L * (12 * h * h + 13 * h) + 2 * h;
  REQUIRE(params == 124'439'808);
  const int dp = 8;
  // fp32 gradients: a MiB is 2^18 elements; buckets are cut at multiples of dp.
  auto buckets = [&](std::int64_t mb) {
    const std::int64_t step = mb * (1 << 18) / dp * dp;
    return (params + step - 1) / step;
  };
  const std::string plan = "--model gpt2-124m --dp 8 --gpus 8 --micro-batch 1 --seq-len 256 --precision bf16 ";
  const nlohmann::json by_default = simulate_json(plan);
  const nlohmann::json mb25 = simulate_json(plan + "--grad-bucket-mb 25");
  const nlohmann::json whole = simulate_json(plan + "--grad-bucket-mb 1024");
  auto all_reduces = [](const nlohmann::json& j) { return j["collectives"]["all_reduce"]["count"].get<std::int64_t>(); };
  CHECK(buckets(4) == 119);
  CHECK(buckets(25) == 19);
  CHECK(buckets(1024) == 1);
  // The other all-reduces (the loss, the gradient norm) do not depend on the bucket size.
  CHECK(all_reduces(by_default) - all_reduces(mb25) == buckets(4) - buckets(25));
  CHECK(all_reduces(mb25) - all_reduces(whole) == buckets(25) - buckets(1024));
  // The same gradient bytes, in fewer calls.
  const double grad_bytes = 4.0 * static_cast<double>(params);
  CHECK(by_default["collectives"]["all_reduce"]["bytes"].get<double>() >= grad_bytes);
  CHECK(mb25["collectives"]["all_reduce"]["bytes"].get<double>() ==
        Approx(by_default["collectives"]["all_reduce"]["bytes"].get<double>()));
  CHECK(whole["collectives"]["all_reduce"]["bytes"].get<double>() ==
        Approx(by_default["collectives"]["all_reduce"]["bytes"].get<double>()));

  // After backward nothing overlaps: the same calls, and the iteration waits for them.
  const nlohmann::json after = simulate_json(plan + "--grad-bucket-mb 25 --grad-sync after-backward");
  CHECK(all_reduces(after) == all_reduces(mb25));
  CHECK(after["collectives"]["all_reduce"]["time_s"].get<double>() ==
        Approx(mb25["collectives"]["all_reduce"]["time_s"].get<double>()));
  CHECK(after["iteration_time_s"].get<double>() > mb25["iteration_time_s"].get<double>());
}

TEST_CASE("simulate: vision models' per-stage peak memory matches the memory model", "[sim_backend][memory][vision]") {
  for (const char* name : {"vit-b16", "swin-b"}) {
    const ModelSpec m = *model_preset(name);
    // swin-b has 23 blocks (20 Swin blocks and 3 mergings): pp 2 splits them 11 + 12.
    Plan p = make_plan(m, 2, 1, 2, 8, 4, ScheduleKind::one_f_one_b, Precision::fp32);
    if (m.family == ModelFamily::vit) p.pp = 2;
    INFO(name << " tp " << p.tp << " pp " << p.pp);
    const SimulationResult r = simulate(m, p);
    for (const StageResult& st : r.stages) {
      INFO("stage " << st.stage << ": measured " << st.peak_bytes << " B, model " << st.model.total()
                    << " B (activations " << st.model.activations << ")");
      CHECK(static_cast<double>(st.peak_bytes) == Approx(st.model.total()).epsilon(0.10));
    }
  }
}

TEST_CASE("simulate: a vision model's throughput is counted in images", "[sim_backend][vision]") {
  const ModelSpec m = *model_preset("swin-t");
  const Plan p = make_plan(m, 1, 1, 8, 32, 2, ScheduleKind::one_f_one_b);
  const SimulationResult r = simulate(m, p);
  CHECK(r.samples_per_s == Approx(512 / r.iteration_s));
  CHECK(r.tokens_per_s == Approx(r.samples_per_s * 56 * 56));
  // MFU from the FLOPs per image (models/flops.h), not per token.
  const double flops = training_flops(m, 512, m.seq_len, Recompute::none).model;
  CHECK(r.tflops_per_gpu == Approx(flops / r.iteration_s / 8 / 1e12));
  CHECK(r.mfu > 0.05);
  CHECK(r.mfu < 0.8);
}

TEST_CASE("simulate: LLaVA-1.5-13B's per-stage peak memory matches the memory model, stages split inside either "
          "module",
          "[sim_backend][memory][vqa]") {
  const ModelSpec m = *model_preset("llava-1.5-13b");  // 66 body blocks: 24 encoder layers, projector, joiner, 40
  for (const int first : {12, 33}) {  // stage 0 ends inside the encoder, or inside the decoder (its 8th layer)
    Plan p = make_plan(m, 8, 2, 1, 1, 4, ScheduleKind::one_f_one_b);
    p.first_stage_layers = first;
    p.recompute = Recompute::full;
    INFO("first stage " << first << " blocks");
    const SimulationResult r = simulate(m, p);
    for (const StageResult& st : r.stages) {
      INFO("stage " << st.stage << ": measured " << st.peak_bytes << " B, model " << st.model.total()
                    << " B (activations " << st.model.activations << ")");
      CHECK(static_cast<double>(st.peak_bytes) == Approx(st.model.total()).epsilon(0.10));
    }
    // Images: 576 patches and 64 question tokens each.
    CHECK(r.tokens_per_s == Approx(r.samples_per_s * 640));
  }
}
