#include "engine/simulation/simulation.h"

#include "core/host_memory.h"
#include "core/names.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "engine/memory/out_of_memory.h"
#include "engine/plan/fp8_recipe.h"
#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "engine/simulation/rank_classes.h"
#include "engine/step/step_engine.h"
#include "engine/step/training_engine.h"
#include "models/flops.h"
#include "models/model_io.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

Error out_of_memory(const StageResult& s, const Plan& p, double device_bytes) {
  const MemoryBreakdown& m = s.model;
  OutOfMemory o;
  o.rank = s.rank;
  o.where = position_holders(p, s.rank);
  o.peak = static_cast<double>(s.peak_bytes);
  o.capacity = device_bytes;
  o.consumers = memory_consumers(m);
  o.detail = fmt::format("{} micro-batches in flight, analytic total {}", m.inflight, human_bytes(m.total()));
  o.fix = fmt::format("Try more pipeline or tensor parallelism, --zero {}, or --recompute full; or keep the optimizer "
                      "state in host memory with --offload optimizer",
                      std::min(p.zero + 1, 2));
  return make_error("{}", out_of_memory_message(o));
}

// Each segment's and boundary's compute and bytes (the backends' regions), in plan order.
// Simulated rank i stands for stands_for[i] ranks.
std::vector<RegionResult> segment_regions(const ModelSpec& m, const Plan& p, const SimReport& report,
                                          const std::vector<int>& stands_for) {
  std::map<std::string, RegionResult> by_name;
  for (std::size_t i = 0; i < report.ranks.size(); ++i)
    for (const auto& [name, figures] : report.ranks[i].regions) {
      if (name.empty()) continue;  // outside every segment (set-up)
      RegionResult& g = by_name[name];
      const int n = stands_for[i];
      g.ranks += n;
      g.compute_max_s = std::max(g.compute_max_s, figures.first);
      g.compute_mean_s += figures.first * n;
      g.sent_bytes += figures.second * n;
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
    const std::vector<double> shares = routing.shares(l, m.experts, m.top_k);
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
  // Each stage's EP groups are its own: the summed time over stages, per stage. A representative run
  // counts one EP group a stage; full fidelity counts each of them (world / (pp·ep)): per group.
  const auto& a2a = r.collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllToAll)];
  const double groups = r.fidelity == Fidelity::full ? static_cast<double>(p.world_size()) / (p.pp * p.ep) : 1.0;
  s.all_to_all_s = a2a.time_s / p.pp / groups;
  s.all_to_all_exposed_s = p.moe_a2a_overlap ? r.idle.expert_parallel_s : s.all_to_all_s;
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

Result<CrossEntropyImpl> cross_entropy_impl_from_name(std::string_view name) {
  if (name == "fused") return CrossEntropyImpl::fused;
  if (name == "unfused") return CrossEntropyImpl::unfused;
  return make_error("unknown cross-entropy implementation '{}'; known: fused (kernels reading the 16-bit logits, "
                    "Megatron-Core's --cross-entropy-loss-fusion), unfused (Megatron's PyTorch ops over an fp32 copy, "
                    "its default before that flag)",
                    name);
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
std::string_view fidelity_name(Fidelity f) { return f == Fidelity::full ? "full" : "representative"; }

Result<Fidelity> fidelity_from_name(std::string_view name) {
  if (name == "representative") return Fidelity::representative;
  if (name == "full") return Fidelity::full;
  return make_error("unknown fidelity '{}'; known: representative (a few ranks per class of ranks that act "
                    "alike), full (every rank's ops and flows)", name);
}

// Under full fidelity, whether every rank runs as its own representative
// because no rank's part is a shifted copy of another's: a segmented plan's
// boundaries pair particular ranks, and an expert group (ep > 1) is a block
// of the data-parallel ranks that a shift along dp would cut across (the
// shifted replicas would meet in groups that do not exist).
bool each_rank_its_own(const Plan& p, bool full) { return full && (!p.segments.empty() || p.ep > 1); }

SimJob simulation_job(const Plan& p, bool full, std::map<int, double> stragglers, std::vector<int> gpus) {
  SimJob job;
  job.world_size = p.world_size();
  job.gpus = std::move(gpus);
  const bool segmented = !p.segments.empty();
  if (each_rank_its_own(p, full)) {
    job.stage_of = pipeline_positions(p);  // a uniform plan's: the rank's stage
    for (int r = 0; r < job.world_size; ++r) job.representatives.push_back(r);
    job.replicas.resize(job.representatives.size());
    job.rank_map = [](int, int, int rank) { return rank; };
    job.stragglers = std::move(stragglers);
    return job;
  }
  RankClasses classes = rank_classes(p);
  if (segmented) job.stage_of = std::move(classes.position_of);
  job.representatives = std::move(classes.representatives);
  job.stands_for = std::move(classes.stands_for);
  job.stages = !segmented;
  if (!full) return job;
  job.stragglers = std::move(stragglers);
  const Mesh mesh(p);
  job.replicas.resize(job.representatives.size());
  for (int r = 0; r < job.world_size; ++r) {
    const Coord c = mesh.coord_of(r);
    if (c.tp != 0 || c.cp != 0 || c.dp != 0) job.replicas[static_cast<std::size_t>(c.pp)].push_back(r);
  }
  // Member (t, c, d, s) plays for the representative (0, 0, 0, s) the rank
  // shifted by its own coordinates (tp, cp and dp wrap around).
  job.rank_map = [mesh](int, int member, int rank) {
    const Coord m = mesh.coord_of(member), x = mesh.coord_of(rank);
    return mesh.rank_of(Coord{(x.tp + m.tp) % mesh.tp(), (x.cp + m.cp) % mesh.cp(), (x.dp + m.dp) % mesh.dp(), x.pp});
  };
  return job;
}

SimOptions simulation_options(const SimulateOptions& options, bool full) {
  SimOptions o;
  o.trace = options.trace;
  o.calibration = options.calibration;
  o.kernels = options.kernels;
  o.fidelity = full ? Fidelity::full : Fidelity::representative;
  o.isolate_exclusive = options.isolate_exclusive;
  o.links = options.variation.links;
  o.host_sharing = options.host_sharing;
  return o;
}

namespace {

// The second iteration of `two` (two iterations issued) as `two` minus `one`
// (the first alone); the peak memory is `two`'s (SimulateOptions::steady_state).
SimReport second_iteration(const SimReport& one, const SimReport& two) {
  SimReport r = two;
  r.iteration_s = two.iteration_s - one.iteration_s;
  r.tasks = two.tasks - one.tasks;
  r.events = two.events - one.events;
  r.tasks_run = two.tasks_run - one.tasks_run;
  r.flows = two.flows - one.flows;
  for (std::size_t k = 0; k < r.collectives.size(); ++k) {
    r.collectives[k].time_s -= one.collectives[k].time_s;
    r.collectives[k].count -= one.collectives[k].count;
    r.collectives[k].bytes -= one.collectives[k].bytes;
  }
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    SimRankReport& a = r.ranks[i];
    const SimRankReport& b = one.ranks[i];
    a.compute_s -= b.compute_s;
    a.compute_stream_s -= b.compute_stream_s;
    a.compute_busy_s -= b.compute_busy_s;
    a.idle_s = std::max(0.0, r.iteration_s - a.compute_busy_s);
    a.idle_causes = subtract_idle(a.idle_causes, b.idle_causes);
    a.tasks -= b.tasks;
    for (auto& [name, figures] : a.regions)
      if (auto it = b.regions.find(name); it != b.regions.end()) {
        figures.first -= it->second.first;
        figures.second -= it->second.second;
      }
  }
  for (std::size_t j = 0; j < r.jobs.size(); ++j) {
    r.jobs[j].iteration_s -= one.jobs[j].iteration_s;
    for (std::size_t k = 0; k < r.jobs[j].compute_s.size(); ++k) r.jobs[j].compute_s[k] -= one.jobs[j].compute_s[k];
  }
  return r;
}

// The causes' sum made to match the stage's idle time: the executor charges
// idle time up to the last task of the whole run, a job's idle ends with the
// job, and a steady-state difference of two runs need not split exactly.
IdleBreakdown reconciled(IdleBreakdown b, double idle_s) {
  const double total = b.total();
  if (total > idle_s && total > 0) return b.scaled(idle_s / total);
  b.other_s += idle_s - total;
  return b;
}

// Precision fp8 needs FP8 units, in any segment.
Status check_fp8_plan(const Plan& p, const sim::DeviceSpec& device) {
  const std::vector<Plan> segments = plan_segments(p);
  const bool any =
      std::any_of(segments.begin(), segments.end(), [](const Plan& s) { return s.precision == Precision::fp8; });
  return any ? check_fp8_device(device) : ok_status();
}

}  // namespace

namespace {

// SimulateOptions::moe_dispatcher on the representatives' expert groups (the
// step engines' meshes are Mesh(p), so the ids agree).
Status use_moe_dispatcher(SimCluster& cluster, int job, const ModelSpec& m, const Plan& p,
                          const std::string& dispatcher) {
  if (dispatcher == "alltoall") return ok_status();
  if (dispatcher != "deepep" && dispatcher != "hybridep")
    return Error(unknown_name_message("MoE dispatcher", dispatcher, {"alltoall", "deepep", "hybridep"}));
  if (!model_io(m).routes_to_experts) return make_error("MoE dispatcher '{}': the model has no experts", dispatcher);
  const Mesh mesh(p);  // a model with experts runs under one plan for the whole model (validate_plan)
  for (int r : cluster.representatives(job))
    cluster.backend(job, r).use_expert_dispatch(mesh.group_of(GroupKind::expert, r)->id, m.experts, m.top_k);
  return ok_status();
}

}  // namespace

Status issue_iterations(SimCluster& cluster, int job, const ModelSpec& m, const Plan& p,
                        const SimulateOptions& options, int iterations) {
  const int seq = p.effective_seq_len(m);
  // Every rank of a plan made of segments reads the whole global batch (training_engine.h, DataShare).
  const std::vector<HostBatch> microbatches =
      p.segments.empty()
          ? std::vector<HostBatch>(static_cast<std::size_t>(p.microbatches()), example_batch(m, p.micro_batch, seq))
          : std::vector<HostBatch>{example_batch(m, p.effective_global_batch(), seq)};
  StepOptions step_options;
  step_options.initialize_parameters = false;  // the sim backend holds no values
  step_options.dropout = options.kernels.dropout;  // the engine's dropout kernels, timed
  MT_TRY(check_step_options(step_options));
  const bool routes = model_io(m).routes_to_experts;
  MT_TRY(options.moe_routing.check(m.experts, routes ? m.moe_layer_count() : 0));
  if (routes) {
    step_options.moe_routing = std::make_shared<MoeRouting>(options.moe_routing);
  }
  const std::vector<int>& reps = cluster.representatives(job);
  std::vector<std::unique_ptr<TrainingEngine>> engines;
  for (int r : reps) engines.push_back(make_engine(cluster.backend(job, r), m, p, step_options));
  MT_TRY(use_moe_dispatcher(cluster, job, m, p, options.moe_dispatcher));
  // The output layer's GEMMs (a dimension of the vocabulary shard) stay bf16 (engine/plan/fp8_recipe.h).
  if (p.precision == Precision::fp8)
    for (int r : reps) cluster.backend(job, r).use_fp8_gemms(padded_vocab(m, p.tp) / p.tp);
  // The iterations' PCIe traffic and host updates, without the set-up's (SimRankReport::host_work).
  for (int r : reps) cluster.backend(job, r).reset_host_work();
  // Nothing blocks on data in the sim backend, so each representative issues
  // its whole iteration in turn; the cluster times them together.
  for (std::size_t i = 0; i < engines.size(); ++i)
    for (int it = 1; it <= iterations; ++it) {
      auto r = engines[i]->step(microbatches, 1e-4f, it);
      if (!r) return std::move(r.context(fmt::format("simulating rank {}", reps[i]))).error();
    }
  return ok_status();
}

Status apply_calibration(const std::string& file, const std::string& transport, int world_size, Precision precision,
                         sim::Calibration& calibration, SimulateOptions& options) {
  MT_ASSIGN(calibration, sim::load_calibration(file));
  const bool mpi = transport == "mpi";
  if (mpi && std::none_of(calibration.collectives.begin(), calibration.collectives.end(),
                          [](const auto& c) { return c.transport == "mpi"; }))
    return make_error("--comm mpi: calibration '{}' has no collectives measured over MPI; make it "
                      "with `mpirun -np N meshtrain calibrate ...` (its kernels are then also "
                      "measured inside one bound MPI process)", file);
  const int per_node = mpi ? 1 : std::min(world_size, options.cluster.gpus_per_node);
  calibration = calibration.for_ranks_sharing(per_node).for_transport(transport);
  if (!mpi) options.host_sharing = sim::host_sharing_for(calibration, per_node);
  MT_TRY(sim::check_calibration_device(calibration, options.cluster).context(fmt::format("--calibration '{}'", file)));
  // After the device: another machine's times are wrong whatever their dtype. fp16 costs as bf16
  // (sim::DType), so a bf16 calibration stands for both.
  // An fp8 run is a bf16 one but for its linear GEMMs, which a bf16 file's "fp8" GEMM entries time,
  // and their operands' casts (memory-bound, as the file's fp8_cast entries or its memory curve).
  const sim::DType run = precision == Precision::fp32 ? sim::DType::kFp32 : sim::DType::kBf16;
  MT_TRY(sim::check_calibration_precision(calibration, run).context(fmt::format("--calibration '{}'", file)));
  sim::apply_link_calibration(calibration, options.cluster);
  options.calibration = &calibration;
  return ok_status();
}

namespace {

// The simulated iteration: its report (the second of two under steady_state), the cluster that ran it, for
// its trace, and how many ranks each simulated rank stood for (SimJob::stands_for; empty: itself alone).
struct SimulatedRun {
  std::unique_ptr<SimCluster> cluster;
  SimReport report;
  std::vector<int> stands_for;
};

Result<SimulatedRun> run_iterations(const ModelSpec& m, const Plan& p, const SimulateOptions& options, bool full) {
  // One job for both clusters of a steady-state run: its rank classes are the plan's, not the run's.
  const SimJob job = simulation_job(p, full, options.variation.stragglers);
  auto new_cluster = [&] {
    return SimCluster::create_jobs(options.cluster, p.world_size(), {job}, simulation_options(options, full));
  };
  SimulatedRun run;
  run.stands_for = job.stands_for;
  MT_ASSIGN(run.cluster, new_cluster());
  MT_TRY(issue_iterations(*run.cluster, 0, m, p, options, 1));
  MT_ASSIGN(run.report, run.cluster->run());
  if (options.steady_state) {
    MT_ASSIGN(run.cluster, new_cluster());
    MT_TRY(issue_iterations(*run.cluster, 0, m, p, options, 2));
    MT_ASSIGN(const SimReport two, run.cluster->run());
    run.report = second_iteration(run.report, two);
  }
  return run;
}

// Under full fidelity: ranks of one class (rank_classes.h) run the same ops, so each is measured against its
// class's median and the one furthest above it named.
void find_slowest_rank(const Plan& p, const SimReport& report, SimulationResult& out) {
  const RankClasses classes = rank_classes(p);
  const std::vector<double>& compute = report.jobs.front().compute_s;
  std::vector<std::vector<double>> by_class(static_cast<std::size_t>(classes.classes));
  for (int r = 0; r < p.world_size(); ++r)
    by_class[static_cast<std::size_t>(classes.class_of[static_cast<std::size_t>(r)])].push_back(
        compute[static_cast<std::size_t>(r)]);
  std::vector<double> median;
  for (auto& v : by_class) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    median.push_back(v[v.size() / 2]);
  }
  double worst = 0;
  for (int r = 0; r < p.world_size(); ++r) {
    const double m = median[static_cast<std::size_t>(classes.class_of[static_cast<std::size_t>(r)])];
    const double ratio = m > 0 ? compute[static_cast<std::size_t>(r)] / m : 1.0;
    if (out.slowest_rank < 0 || ratio > worst) {
      worst = ratio;
      out.slowest_rank = r;
      out.slowest_compute_s = compute[static_cast<std::size_t>(r)];
      out.median_compute_s = m;
    }
  }
}

// Throughput and FLOP rates at out.iteration_s.
void add_rates(const ModelSpec& m, const Plan& p, const SimulateOptions& options, SimulationResult& out) {
  const int seq = p.effective_seq_len(m);
  const double tokens = static_cast<double>(p.effective_global_batch()) * seq;
  out.tokens_per_s = tokens / out.iteration_s;
  out.samples_per_s = static_cast<double>(p.effective_global_batch()) / out.iteration_s;
  const FlopCount flops = training_flops(m, p.effective_global_batch(), seq, p.recompute);
  const double per_gpu = 1.0 / out.iteration_s / p.world_size();
  out.tflops_per_gpu = flops.model * per_gpu / 1e12;
  out.hardware_tflops_per_gpu = flops.hardware * per_gpu / 1e12;
  out.mfu = flops.model * per_gpu / options.cluster.device.peak_bf16_flops;
}

// What simulated rank `r` (the representative of stage `stage` of a uniform plan) measured.
StageResult stage_result(const ModelSpec& m, const Plan& p, const SimRankReport& r, int stage) {
  StageResult s;
  s.stage = stage;
  s.rank = r.rank;
  s.peak_bytes = r.peak_bytes;
  // The sim backend allocated the bf16 tensors; FP8's weight copies and narrower saved inputs are counted here.
  s.peak_bytes += static_cast<std::int64_t>(fp8_extra_bytes(m, p, r.rank));
  s.host_peak_bytes = r.host_peak_bytes;
  s.host_work = r.host_work;
  s.model = rank_memory(m, p, r.rank);
  s.compute_s = r.compute_s;
  s.idle_s = r.idle_s;
  s.idle = reconciled(classify_idle(r.idle_causes), r.idle_s);
  // Compute issued on other streams (casts of compressed gradients, an
  // overlapped update) keeps the compute stream no busier: not subtracted.
  s.exposed_comm_s = std::max(0.0, r.compute_busy_s - r.compute_stream_s);
  s.tasks = r.tasks;
  return s;
}

// Adds stage `s` to the result: its share (the ranks it stands for, of the world) of the means, and the peak
// memory.
void add_stage(const Plan& p, const StageResult& s, SimulationResult& out) {
  const double share = static_cast<double>(s.ranks) / p.world_size();
  out.idle_fraction += s.idle_s / out.iteration_s * share;
  // With a pipeline, the compute stream's idle is its fill and drain plus what
  // they expose (the pipeline formula's bubble; `idle` breaks it down by cause);
  // without one there is no bubble, whatever else the stream waited for. The
  // waits of EP all-to-all overlap's pairs for the expert stream are the
  // steady state's, not the fill's or drain's.
  const double bubble_s =
      p.pp > 1 || !p.segments.empty() ? s.idle_s - s.idle.expert_parallel_s : s.idle.pipeline_s;
  out.bubble_fraction += bubble_s / out.iteration_s * share;
  out.idle += s.idle.scaled(share);
  out.exposed_comm_s += s.exposed_comm_s * share;
  if (s.peak_bytes > out.peak_memory_bytes) {
    out.peak_memory_bytes = s.peak_bytes;
    out.peak_rank = s.rank;
  }
  out.stages.push_back(s);
}

}  // namespace

Result<SimulationResult> simulate_iteration(const ModelSpec& m, const Plan& p,
                                            const SimulateOptions& options) {
  if (Status s = StepEngine::supports(p); !s)
    return std::move(s.context("the step engine cannot run this plan yet")).error();
  const bool segmented = !p.segments.empty();
  MT_TRY(check_simulation_size(m, p));
  MT_TRY(check_fp8_plan(p, options.cluster.device));
  const auto wall_start = std::chrono::steady_clock::now();
  const bool full = options.fidelity == Fidelity::full || !options.variation.empty();
  MT_ASSIGN(const SimulatedRun run, run_iterations(m, p, options, full));
  const SimReport& report = run.report;
  SimulationResult out;
  out.fidelity = full ? Fidelity::full : Fidelity::representative;
  out.tasks_run = report.tasks_run;
  out.flows = report.flows;
  out.isolated_collectives = report.isolated_collectives;
  out.isolated_overlaps = report.isolated_overlaps;
  if (full) find_slowest_rank(p, report, out);
  out.iteration_s = report.iteration_s;
  out.tasks = report.tasks;
  out.events = report.events;
  out.collectives = report.collectives;
  add_rates(m, p, options, out);
  // Each simulated rank stands for its class, or for itself alone (each_rank_its_own).
  const std::vector<int> stands_for =
      run.stands_for.empty() ? std::vector<int>(report.ranks.size(), 1) : run.stands_for;
  for (std::size_t i = 0; i < report.ranks.size(); ++i) {
    StageResult s = stage_result(m, p, report.ranks[i], static_cast<int>(i));
    s.ranks = stands_for[i];
    add_stage(p, s, out);
  }
  if (model_io(m).routes_to_experts) out.moe = moe_simulation(m, p, options.moe_routing, m.moe_layer_count(), out);
  if (segmented) out.regions = segment_regions(m, p, report, stands_for);
  for (std::size_t i = 0; i < report.ranks.size(); ++i)
    for (const auto& [name, figures] : report.ranks[i].regions) out.sent_bytes += figures.second * stands_for[i];
  if (options.check_memory)
    for (const StageResult& s : out.stages)
      if (static_cast<double>(s.peak_bytes) > options.cluster.device.memory_bytes)
        return out_of_memory(s, p, options.cluster.device.memory_bytes);
  if (options.trace) out.trace_json = run.cluster->trace().to_json();
  out.simulator_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return out;
}

}  // namespace meshtrain
