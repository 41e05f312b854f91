// CPU offload (Plan::offload): an offloaded run gives the bits of the same
// plan on the device; the device peak drops by the bytes moved to the host,
// as the memory model and the sim backend say; the bytes that cross the host
// link per step follow from the parameter count, and the gradients cross it
// during backward, bucket by bucket.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "backends/backend_wrapper.h"
#include "engine/memory/memory_model.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

Plan offloaded(Plan p, Offload o) {
  p.offload = o;
  return p;
}

// Offloading moves memory, never values: the bits of the plan without it.
void check_offload_keeps_bits(const ModelSpec& m, const Plan& p, Offload o) {
  INFO("precision " << precision_name(p.precision) << ", offload " << offload_name(o));
  check_same_bits(m, p, offloaded(p, o));
}

// Copies between host and device memory, in bytes, by direction; and the fp32 bytes that all-gathers send.
class HostLinkCounter final : public BackendWrapper {
 public:
  explicit HostLinkCounter(CpuBackend& b) : BackendWrapper(b), cpu_(b) {}
  void copy(const Tensor& src, Tensor& dst) override {
    if (cpu_.on_host(dst) && !cpu_.on_host(src)) to_host += static_cast<std::int64_t>(src.bytes());
    if (cpu_.on_host(src) && !cpu_.on_host(dst)) to_device += static_cast<std::int64_t>(src.bytes());
    target().copy(src, dst);
  }
  void all_gather(const Tensor& in, Tensor& out, const Group& g) override {
    gathered += static_cast<std::int64_t>(in.bytes());
    target().all_gather(in, out, g);
  }
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override {
    gathered += static_cast<std::int64_t>(in.bytes());
    target().all_gather_fp8(in, out, g, fp8_elements);
  }
  // The embedding's backward is the last op of each micro-batch's backward.
  void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, std::int64_t vocab_offset) override {
    to_host_at_embedding_backward = to_host;
    target().embedding_backward(dout, ids, dtable, vocab_offset);
  }
  std::int64_t to_host = 0, to_device = 0, gathered = 0;
  std::int64_t to_host_at_embedding_backward = 0;  // to_host when the step's last embedding backward was issued

 private:
  CpuBackend& cpu_;
};

struct StepFigures {
  std::vector<MemoryStats> memory;              // per rank, over one step
  std::vector<std::int64_t> to_host, to_device, gathered;  // per rank, over one step
  std::vector<std::int64_t> to_host_in_backward;  // per rank: to_host before the last embedding backward
};

// One step of plan `p` on every rank (ranks as threads), counted from the step's start.
StepFigures one_step(const ModelSpec& m, const Plan& p) {
  const Mesh mesh(p);
  const auto n = static_cast<std::size_t>(p.world_size());
  StepFigures f{std::vector<MemoryStats>(n), std::vector<std::int64_t>(n), std::vector<std::int64_t>(n),
                std::vector<std::int64_t>(n), std::vector<std::int64_t>(n)};
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend cpu(comm);
    HostLinkCounter b(cpu);
    TrainingEngine engine(b, m, p, step_options());
    const int d = mesh.coord_of(rank).dp, per = p.microbatches();
    const std::vector<HostBatch> all = global_batch(m, 1);
    const std::vector<HostBatch> mine(all.begin() + d * per, all.begin() + (d + 1) * per);
    b.reset_peak();
    b.to_host = b.to_device = b.gathered = 0;
    MT_ASSIGN(StepResult r, engine.step(mine, 1e-2f, 1));
    (void)r;
    const auto i = static_cast<std::size_t>(rank);
    f.memory[i] = b.memory_stats();
    f.to_host[i] = b.to_host, f.to_device[i] = b.to_device, f.gathered[i] = b.gathered;
    f.to_host_in_backward[i] = b.to_host_at_embedding_backward;
    return ok_status();
  });
  REQUIRE(s.ok());
  return f;
}

// The parameters of the model as the tiny plans hold them (tp 1, pp 1: every rank the whole model).
std::int64_t parameter_count(const ModelSpec& m) {
  return count_shard_parameters(m, 1, Plan{}.stage_split(), 1, 0, 1).total;
}

}  // namespace

TEST_CASE("offloaded optimizer state and parameters give the bits of the run on the device", "[parallel][offload]") {
  const ModelSpec m = tiny_gpt();
  check_offload_keeps_bits(m, make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), Offload::optimizer);
  for (int zero : {1, 2, 3}) check_offload_keeps_bits(m, make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b), Offload::optimizer);
  check_offload_keeps_bits(m, make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b), Offload::params);
  check_offload_keeps_bits(m, make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2), Offload::optimizer);
  check_offload_keeps_bits(m, make_plan(1, 2, 2, 3, ScheduleKind::one_f_one_b), Offload::params);
  // 1-bit gradients (ZeRO 1) with a warm-up: the frozen variance is the host kernel's too.
  Plan one_bit = make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b);
  one_bit.grad_compression = GradCompression::one_bit;
  one_bit.grad_compression_warmup = 1;
  check_offload_keeps_bits(m, one_bit, Offload::optimizer);
}

TEST_CASE("offload lowers the device peak by the offloaded bytes: measured, modelled and simulated",
          "[parallel][offload][memory]") {
  const ModelSpec m = tiny_gpt();
  auto cluster = sim::cluster_preset("dgx-a100");
  REQUIRE(cluster.ok());
  SimulateOptions sim_options;
  sim_options.cluster = *cluster;
  for (auto [zero, mode] : {std::pair{1, Offload::optimizer}, std::pair{2, Offload::optimizer},
                            std::pair{3, Offload::optimizer}, std::pair{3, Offload::params}}) {
    const Plan p = make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b), q = offloaded(p, mode);
    INFO("zero " << zero << ", offload " << offload_name(mode));
    const StepFigures base = one_step(m, p), off = one_step(m, q);
    const MemoryBreakdown model_base = memory_per_rank(m, p, 0, meshtrain_layout(p));
    const MemoryBreakdown model_off = memory_per_rank(m, q, 0, meshtrain_layout(q));
    const double model_saving = model_base.total() - model_off.total();
    // fp32: m and v (8 bytes per parameter this rank updates), and with `params` its 4-byte shard.
    CHECK(model_off.offloaded == Approx((mode == Offload::params ? 12.0 : 8.0) * parameter_count(m) / 2));
    CHECK(base.memory[0].host_peak_bytes == 0);
    for (int r = 0; r < 2; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const double measured = static_cast<double>(base.memory[i].peak_bytes - off.memory[i].peak_bytes);
      INFO("rank " << r << ": device peak " << base.memory[i].peak_bytes << " -> " << off.memory[i].peak_bytes
                   << " B, model saves " << model_saving << " B; host " << off.memory[i].host_peak_bytes
                   << " B, model " << model_off.host);
      CHECK(measured == Approx(model_saving).epsilon(0.05));
      // Master, m, v and the gradient staging: 16 bytes per parameter the rank updates (buckets pad a little).
      CHECK(static_cast<double>(off.memory[i].host_peak_bytes) == Approx(model_off.host).epsilon(0.02));
    }
    auto sim_base = simulate_iteration(m, p, sim_options), sim_off = simulate_iteration(m, q, sim_options);
    REQUIRE(sim_base.ok());
    REQUIRE(sim_off.ok());
    const double simulated = static_cast<double>(sim_base->stages[0].peak_bytes - sim_off->stages[0].peak_bytes);
    INFO("sim peak " << sim_base->stages[0].peak_bytes << " -> " << sim_off->stages[0].peak_bytes);
    CHECK(simulated == Approx(static_cast<double>(base.memory[0].peak_bytes - off.memory[0].peak_bytes)).epsilon(0.05));
    CHECK(static_cast<double>(sim_off->stages[0].host_peak_bytes) ==
          Approx(static_cast<double>(off.memory[0].host_peak_bytes)).epsilon(0.01));
  }
}

TEST_CASE("the bytes an offloaded step moves over the host link follow from the parameter count",
          "[parallel][offload][pcie]") {
  const ModelSpec m = tiny_gpt();
  const std::int64_t P = parameter_count(m);
  // Optimizer offload: each rank sends the fp32 gradients of the parameters it updates to the host
  // and gets their fp32 values back; over the dp ranks those are every parameter once.
  for (int zero : {0, 1, 2, 3}) {
    INFO("zero " << zero);
    const Plan p = offloaded(make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b), Offload::optimizer);
    const StepFigures f = one_step(m, p);
    const std::int64_t owned = zero == 0 ? 4 * P : 4 * P / 2;
    for (std::size_t r = 0; r < 2; ++r) {
      // Sharded, a rank's last bucket shard may hold a few of the padding elements' slots fewer.
      CHECK(static_cast<double>(f.to_host[r]) == Approx(static_cast<double>(owned)).epsilon(0.01));
      CHECK(f.to_device[r] == f.to_host[r]);
    }
    if (zero > 0) CHECK(f.to_host[0] + f.to_host[1] == 4 * P);
    // Each bucket goes down as soon as it is reduced: the layers' buckets before the last
    // micro-batch's backward reaches the embeddings, whose bucket (the tied head's too) is last.
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << f.to_host_in_backward[r] << " of " << f.to_host[r] << " bytes during backward");
      CHECK(f.to_host_in_backward[r] > f.to_host[r] / 2);
      CHECK(f.to_host_in_backward[r] < f.to_host[r]);
    }
  }
  // Parameter offload: the gradients go down as before; nothing comes back after the update (the host
  // shards are the master), but every gather first brings its fp32 shard up: what the all-gathers send.
  const Plan p = offloaded(make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b), Offload::params);
  const StepFigures f = one_step(m, p);
  CHECK(f.to_host[0] + f.to_host[1] == 4 * P);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(f.to_device[r] == f.gathered[r]);
    // Every layer is gathered at least once in each micro-batch's forward and once in its backward.
    CHECK(f.to_device[r] >= 2 * p.microbatches() * 4 * P / 2);
  }
}

TEST_CASE("offload refuses what it does not support, by name", "[parallel][offload]") {
  Plan p = offloaded(make_plan(1, 1, 2, 2, ScheduleKind::one_f_one_b), Offload::params);
  const Status s = validate_plan(p, tiny_gpt());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("params needs zero 3, got zero 2") && Catch::Contains("--zero 3"));
  auto parsed = parse_offload("nvme");
  REQUIRE_FALSE(parsed.ok());
  CHECK_THAT(parsed.error().message(), Catch::Contains("optimizer") && Catch::Contains("params"));
  PlanOverrides o;
  o.offload = "optimizer";
  auto applied = apply_overrides(Plan{}, o);
  REQUIRE(applied.ok());
  CHECK(applied->offload == Offload::optimizer);
  CHECK(plan_to_json(*applied)["offload"] == "optimizer");
  CHECK_FALSE(plan_to_json(Plan{}).contains("offload"));
}
