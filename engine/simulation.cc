#include "engine/simulation.h"

#include "core/host_memory.h"

#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "engine/mesh.h"
#include "engine/segments/segment_plan.h"
#include "engine/step_engine.h"
#include "engine/training_engine.h"
#include "models/flops.h"

namespace meshtrain {

namespace {

Error out_of_memory(const StageResult& s, const Plan& p, double device_bytes) {
  const MemoryBreakdown& m = s.model;
  return make_error(
      "out of memory: rank {} (pipeline stage {}, and every tp rank and dp replica of that stage) "
      "peaks at {} but the device has {}. Analytic breakdown for this stage: parameters {}, "
      "gradients {}, optimizer {}, zero-3 gathered {}, activations {} ({} micro-batches in flight), "
      "total {}. Try more pipeline or tensor parallelism, --zero {}, or --recompute full",
      s.rank, s.stage, human_bytes(static_cast<double>(s.peak_bytes)), human_bytes(device_bytes),
      human_bytes(m.parameters), human_bytes(m.gradients), human_bytes(m.optimizer),
      human_bytes(m.zero3_working), human_bytes(m.activations), m.inflight, human_bytes(m.total()),
      std::min(p.zero + 1, 2));
}

// Each segment's and boundary's compute and bytes (the backends' regions), in plan order.
std::vector<RegionResult> segment_regions(const ModelSpec& m, const Plan& p, const SimReport& report) {
  std::map<std::string, RegionResult> by_name;
  for (const SimRankReport& r : report.ranks)
    for (const auto& [name, figures] : r.regions) {
      if (name.empty()) continue;  // outside every segment (set-up)
      RegionResult& g = by_name[name];
      ++g.ranks;
      g.compute_max_s = std::max(g.compute_max_s, figures.first);
      g.compute_mean_s += figures.first;
      g.sent_bytes += figures.second;
    }
  std::vector<RegionResult> out;
  auto take = [&](const std::string& region, std::string label, double memory) {
    auto it = by_name.find(region);
    RegionResult g = it == by_name.end() ? RegionResult{} : it->second;
    if (g.ranks > 0) g.compute_mean_s /= g.ranks;
    g.name = std::move(label);
    g.memory_bytes = memory;
    out.push_back(std::move(g));
  };
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    double memory = 0;
    for (int stage = 0; stage < s.pp; ++stage)
      memory = std::max(memory, memory_per_rank(m, s, stage, meshtrain_layout(s)).total());
    take(fmt::format("segment {}", k), fmt::format("segment {} ({})", k, s.segment_name), memory);
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k)
    take(fmt::format("boundary {}", k), fmt::format("boundary {}", k), 0);
  take("all segments", "loss and norm", 0);
  return out;
}

MoeSimulation moe_simulation(const ModelSpec& m, const Plan& p, const MoeRouting& routing, int moe_layers,
                             const SimulationResult& r) {
  MoeSimulation s;
  s.routing = routing.spec();
  const double assignments = static_cast<double>(p.effective_global_batch()) * p.effective_seq_len(m) * m.top_k;
  const int local = m.experts / p.ep;
  for (int l = 0; l < moe_layers; ++l) {
    const std::vector<double> shares = routing.shares(l, m.experts);
    std::vector<double> tokens;
    double max = 0, busiest = 0;
    for (double share : shares) tokens.push_back(share * assignments), max = std::max(max, share);
    for (int q = 0; q < p.ep; ++q) {
      double load = 0;
      for (int e = q * local; e < (q + 1) * local; ++e) load += shares[static_cast<std::size_t>(e)];
      busiest = std::max(busiest, load * p.ep);
    }
    s.load_max_over_mean = std::max(s.load_max_over_mean, max * m.experts);
    s.busiest_rank_load = std::max(s.busiest_rank_load, busiest);
    s.tokens_per_expert.push_back(std::move(tokens));
  }
  // Each stage's EP groups are its own: the summed time over stages, per stage.
  const auto& a2a = r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllToAll)];
  s.all_to_all_s = a2a.time_s / p.pp;
  s.all_to_all_exposed_s = s.all_to_all_s;
  s.all_to_all_share = s.all_to_all_exposed_s / r.iteration_s;
  return s;
}

}  // namespace

Result<AttentionImpl> attention_impl_from_name(std::string_view name) {
  if (name == "flash") return AttentionImpl::flash;
  if (name == "unfused") return AttentionImpl::unfused;
  return make_error("unknown attention implementation '{}'; known: flash (fused, FlashAttention-2), unfused "
                    "(separate score GEMM, softmax, dropout and context GEMM, as Megatron-LM in 2021)",
                    name);
}

std::string_view attention_impl_name(AttentionImpl a) {
  return a == AttentionImpl::unfused ? "unfused" : "flash";
}

namespace {

// What a simulation holds, measured on dgx-a100 runs (RESULTS.md, reliability):
// about 3.5 KiB of topology per GPU (1,048,576 GPUs: 3.6 GB) and 40-50 bytes
// per simulated op; each micro-batch's token ids and targets on the host.
constexpr double kSimBytesPerGpu = 4096;
constexpr double kSimBytesPerOp = 64;
constexpr double kSimOpsPerLayer = 40;  // forward and backward of one layer and micro-batch (about 32 measured)

// Refuses, with the figure, a simulation that would not fit in this machine's memory.
Status check_simulation_size(const ModelSpec& m, const Plan& p) {
  const double seq = p.effective_seq_len(m);
  const double microbatches = p.microbatches();
  const double batch_bytes = microbatches * p.micro_batch * seq * 2 * sizeof(std::int32_t);
  const double ops = microbatches * p.vpp * (static_cast<double>(m.layers) + 2 * p.pp) * kSimOpsPerLayer;
  const double bytes = batch_bytes + ops * kSimBytesPerOp + kSimBytesPerGpu * p.world_size();
  return check_host_memory(
      bytes,
      fmt::format("simulating {} GPUs running {} micro-batches of {} x {} tokens ({:.3g} ops)", p.world_size(),
                  p.microbatches(), p.micro_batch, p.effective_seq_len(m), ops),
      "simulate fewer GPUs, micro-batches (--micro-batches, --global-batch), a smaller --micro-batch or "
      "a shorter --seq-len");
}

}  // namespace

Result<SimulationResult> simulate_iteration(const ModelSpec& m, const Plan& p,
                                            const SimulateOptions& options) {
  if (Status s = StepEngine::supports(p); !s)
    return std::move(s.context("the step engine cannot run this plan yet")).error();
  // Representatives: one per pipeline stage (sim_cluster.h); a plan made of
  // segments simulates every rank, since its boundaries pair particular ranks.
  const bool segmented = !p.segments.empty();
  std::vector<int> reps;
  if (segmented) {
    for (int r = 0; r < p.world_size(); ++r) reps.push_back(r);
  } else {
    const Mesh mesh(p);
    for (int stage = 0; stage < p.pp; ++stage) reps.push_back(mesh.rank_of(Coord{0, 0, 0, stage}));
  }
  StepOptions step_options;
  step_options.initialize_parameters = false;  // the sim backend holds no values
  step_options.dropout = options.dropout;       // the engine's dropout kernels, timed
  MT_TRY(check_step_options(step_options));
  MT_TRY(check_simulation_size(m, p));
  int moe_layers = 0;
  for (int l = 0; l < m.layers; ++l) moe_layers += m.moe_layer(l) ? 1 : 0;
  if (m.moe()) {
    MT_TRY(options.moe_routing.check(m.experts, moe_layers));
    step_options.moe_routing = std::make_shared<MoeRouting>(options.moe_routing);
  }
  SimOptions sim_options;
  sim_options.trace = options.trace;
  sim_options.calibration = options.calibration;
  sim_options.attention = options.attention;
  sim_options.attention_dropout = options.dropout;
  MT_ASSIGN(std::unique_ptr<SimCluster> cluster,
            SimCluster::create(options.cluster, p.world_size(), reps, sim_options));

  const int seq = p.effective_seq_len(m);
  // Every rank of a plan made of segments reads the whole global batch (training_engine.h, DataShare).
  const std::vector<HostBatch> microbatches =
      segmented ? std::vector<HostBatch>{example_batch(m, p.effective_global_batch(), seq)}
                : std::vector<HostBatch>(static_cast<std::size_t>(p.microbatches()), example_batch(m, p.micro_batch, seq));

  {
    std::vector<std::unique_ptr<TrainingEngine>> engines;
    for (int r : reps) engines.push_back(make_engine(cluster->backend(r), m, p, step_options));
    // Nothing blocks on data in the sim backend, so each representative issues
    // its whole iteration in turn; the cluster times them together below.
    for (std::size_t i = 0; i < engines.size(); ++i) {
      auto r = engines[i]->step(microbatches, 1e-4f, 1);
      if (!r) return std::move(r.context(fmt::format("simulating rank {}", reps[i]))).error();
    }
  }
  MT_ASSIGN(SimReport report, cluster->run());

  SimulationResult out;
  out.iteration_s = report.iteration_s;
  out.tasks = report.tasks;
  out.events = report.events;
  out.collectives = report.collectives;
  const double tokens = static_cast<double>(p.effective_global_batch()) * seq;
  out.tokens_per_s = tokens / out.iteration_s;
  out.samples_per_s = static_cast<double>(p.effective_global_batch()) / out.iteration_s;
  const FlopCount flops = training_flops(m, p.effective_global_batch(), seq, p.recompute);
  const double per_gpu = 1.0 / out.iteration_s / p.world_size();
  out.tflops_per_gpu = flops.model * per_gpu / 1e12;
  out.hardware_tflops_per_gpu = flops.hardware * per_gpu / 1e12;
  out.mfu = flops.model * per_gpu / options.cluster.device.peak_bf16_flops;
  for (std::size_t i = 0; i < report.ranks.size(); ++i) {
    const SimRankReport& r = report.ranks[i];
    StageResult s;
    s.stage = static_cast<int>(i);
    s.rank = r.rank;
    s.peak_bytes = r.peak_bytes;
    s.model = segmented ? rank_memory(m, p, r.rank) : memory_per_rank(m, p, s.stage, meshtrain_layout(p));
    s.compute_s = r.compute_s;
    s.idle_s = r.idle_s;
    s.exposed_comm_s = std::max(0.0, r.compute_busy_s - r.compute_s);
    s.tasks = r.tasks;
    out.bubble_fraction += s.idle_s / out.iteration_s / static_cast<double>(report.ranks.size());
    out.exposed_comm_s += s.exposed_comm_s / static_cast<double>(report.ranks.size());
    if (s.peak_bytes > out.peak_memory_bytes) {
      out.peak_memory_bytes = s.peak_bytes;
      out.peak_rank = s.rank;
    }
    out.stages.push_back(s);
  }
  if (m.moe()) out.moe = moe_simulation(m, p, options.moe_routing, moe_layers, out);
  if (segmented) out.regions = segment_regions(m, p, report);
  const double stand_for = segmented ? 1.0 : static_cast<double>(p.tp) * p.cp * p.dp;
  for (const SimRankReport& r : report.ranks)
    for (const auto& [name, figures] : r.regions) out.sent_bytes += figures.second * stand_for;
  if (options.check_memory)
    for (const StageResult& s : out.stages)
      if (static_cast<double>(s.peak_bytes) > options.cluster.device.memory_bytes)
        return out_of_memory(s, p, options.cluster.device.memory_bytes);
  if (options.trace) out.trace_json = cluster->trace().to_json();
  return out;
}

}  // namespace meshtrain
