#include "engine/cli/simulate_command.h"

#include <algorithm>

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/host_memory.h"
#include "core/input_file.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/mesh.h"
#include "engine/step_engine.h"
#include "models/flops.h"
#include "simulator/calibration.h"

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

Result<SimulationResult> simulate_iteration(const ModelSpec& m, const Plan& p,
                                            const SimulateOptions& options) {
  if (Status s = StepEngine::supports(p); !s)
    return std::move(s.context("the step engine cannot run this plan yet")).error();
  MT_TRY(StepEngine::supports(m));
  const Mesh mesh(p);
  std::vector<int> reps;
  for (int stage = 0; stage < p.pp; ++stage) reps.push_back(mesh.rank_of(Coord{0, 0, 0, stage}));
  StepOptions step_options;
  step_options.initialize_parameters = false;  // the sim backend holds no values
  step_options.dropout = options.dropout;       // the engine's dropout kernels, timed
  MT_TRY(check_step_options(step_options));
  MT_TRY(check_simulation_size(m, p));
  SimOptions sim_options;
  sim_options.trace = options.trace;
  sim_options.calibration = options.calibration;
  sim_options.attention = options.attention;
  sim_options.attention_dropout = options.dropout;
  MT_ASSIGN(std::unique_ptr<SimCluster> cluster,
            SimCluster::create(options.cluster, p.world_size(), reps, sim_options));

  const int seq = p.effective_seq_len(m);
  HostBatch batch;
  batch.batch = p.micro_batch;
  batch.seq = seq;
  batch.ids.assign(static_cast<std::size_t>(p.micro_batch) * static_cast<std::size_t>(seq), 0);
  batch.targets = batch.ids;
  const std::vector<HostBatch> microbatches(static_cast<std::size_t>(p.microbatches()), batch);

  {
    std::vector<std::unique_ptr<StepEngine>> engines;
    for (int r : reps)
      engines.push_back(std::make_unique<StepEngine>(cluster->backend(r), m, p, mesh, step_options));
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
    s.model = memory_per_rank(m, p, s.stage, meshtrain_layout(p));
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
  if (options.check_memory)
    for (const StageResult& s : out.stages)
      if (static_cast<double>(s.peak_bytes) > options.cluster.device.memory_bytes)
        return out_of_memory(s, p, options.cluster.device.memory_bytes);
  if (options.trace) out.trace_json = cluster->trace().to_json();
  return out;
}

namespace {

struct SimulateFlags {
  PlanFlags plan;
  std::string cluster = "dgx-a100";
  std::optional<int> gpus;  // unset: the plan's world
  std::string calibration, trace;
  std::string comm;  // which measured collectives apply: "threads" (the default) or "mpi"
  bool json = false;
  bool ignore_memory = false;
  std::string attention = "flash";  // the simulated software stack: see SimulateOptions
  float dropout = 0.f;
};

// The README's first command: Megatron's 18.4B GPT on 64 DGX A100 GPUs
// (8 nodes), tensor parallel within a node, two pipeline stages.
void use_example(SimulateFlags& f) {
  f.plan.model = "megatron-18.4b";
  f.gpus = 64;
  f.plan.overrides.tp = 8;
  f.plan.overrides.pp = 2;
  f.plan.overrides.micro_batch = 1;
  f.plan.overrides.global_batch = 256;
}

nlohmann::json to_json(const SimulationResult& r, const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  nlohmann::json collectives = nlohmann::json::object();
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    const SimCollectiveStats& s = r.collectives[static_cast<std::size_t>(k)];
    collectives[sim::collective_kind_name(static_cast<sim::CollectiveKind>(k))] = {
        {"time_s", s.time_s}, {"count", s.count}, {"bytes", s.bytes}};
  }
  nlohmann::json stages = nlohmann::json::array();
  for (const StageResult& s : r.stages)
    stages.push_back({{"stage", s.stage},
                      {"rank", s.rank},
                      {"peak_memory_bytes", s.peak_bytes},
                      {"model_memory_bytes", s.model.total()},
                      {"compute_s", s.compute_s},
                      {"idle_s", s.idle_s},
                      {"exposed_comm_s", s.exposed_comm_s},
                      {"tasks", s.tasks}});
  return {{"model", m.name},
          {"cluster", c.name},
          {"gpus", p.world_size()},
          {"plan", plan_to_json(p)},
          {"iteration_time_s", r.iteration_s},
          {"tokens_per_s", r.tokens_per_s},
          {"tflops_per_gpu", r.tflops_per_gpu},
          {"hardware_tflops_per_gpu", r.hardware_tflops_per_gpu},
          {"mfu", r.mfu},
          {"bubble_fraction", r.bubble_fraction},
          {"exposed_comm_s", r.exposed_comm_s},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"peak_memory_rank", r.peak_rank},
          {"device_memory_bytes", c.device.memory_bytes},
          {"collectives", collectives},
          {"stages", stages},
          {"tasks", r.tasks},
          {"events", r.events}};
}

void print_text(const SimulationResult& r, const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  fmt::print("simulated {} on {} x {} ({}): tp {} pp {} dp {} vpp {} zero {}, micro-batch {}, global batch {}, "
             "schedule {}, recompute {}, {}\n",
             m.name, p.world_size(), c.device.name, c.name, p.tp, p.pp, p.dp, p.vpp, p.zero, p.micro_batch,
             p.effective_global_batch(), schedule_name(p.schedule), recompute_name(p.recompute),
             precision_name(p.precision));
  fmt::print("iteration        {:.4f} s\n", r.iteration_s);
  fmt::print("throughput       {:.0f} tokens/s\n", r.tokens_per_s);
  fmt::print("model FLOP/s     {:.1f} TFLOP/s per GPU, MFU {:.1f}% (of {:.0f} TFLOP/s bf16 peak)\n",
             r.tflops_per_gpu, 100 * r.mfu, c.device.peak_bf16_flops / 1e12);
  fmt::print("hardware FLOP/s  {:.1f} TFLOP/s per GPU\n", r.hardware_tflops_per_gpu);
  fmt::print("bubble           {:.1f}% of the iteration (compute stream idle, mean over stages)\n",
             100 * r.bubble_fraction);
  fmt::print("exposed comm     {:.4f} s per stage (mean)\n", r.exposed_comm_s);
  fmt::print("memory           peak {} on rank {} (device {})\n", human_bytes(static_cast<double>(r.peak_memory_bytes)),
             r.peak_rank, human_bytes(c.device.memory_bytes));
  fmt::print("  {:>5} {:>6} {:>12} {:>12} {:>10} {:>10}\n", "stage", "rank", "peak", "model", "compute s", "idle s");
  for (const StageResult& s : r.stages)
    fmt::print("  {:>5} {:>6} {:>12} {:>12} {:>10.4f} {:>10.4f}\n", s.stage, s.rank,
               human_bytes(static_cast<double>(s.peak_bytes)), human_bytes(s.model.total()), s.compute_s, s.idle_s);
  fmt::print("communication (each collective counted once)\n");
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    const SimCollectiveStats& s = r.collectives[static_cast<std::size_t>(k)];
    if (s.count == 0) continue;
    fmt::print("  {:<15} {:>8} calls {:>10.4f} s {:>12}\n", sim::collective_kind_name(static_cast<sim::CollectiveKind>(k)),
               s.count, s.time_s, human_bytes(s.bytes));
  }
  fmt::print("simulator        {} tasks, {} events\n", r.tasks, r.events);
}

Status run_simulate(SimulateFlags f, bool no_flags) {
  if (no_flags) use_example(f);
  if (f.plan.model.empty()) return make_error("--model NAME|FILE is required (give no model, plan or --gpus flags for the example)");
  if (f.calibration.empty() && !f.comm.empty())
    return make_error("--comm {} chooses which measured collectives of --calibration apply; without "
                      "--calibration it does nothing: add --calibration FILE or drop --comm", f.comm);
  PlanOverrides& o = f.plan.overrides;
  const int gpus = f.gpus.value_or(0);
  if (gpus > 0 && !o.dp) {
    // dp fills the GPUs left by the model-parallel dimensions.
    PlanOverrides file;
    if (!f.plan.plan_file.empty()) {
      MT_ASSIGN(file, plan_overrides_from_file(f.plan.plan_file));
    }
    if (!file.dp) {
      // Each degree is bounded (plan.h), so the product fits in 64 bits.
      const std::int64_t mp = std::int64_t{o.tp.value_or(file.tp.value_or(1))} * o.pp.value_or(file.pp.value_or(1)) *
                              o.cp.value_or(file.cp.value_or(1));
      if (gpus % mp != 0)
        return make_error("--gpus {} is not a multiple of tp·pp·cp = {}; pass a multiple or set --dp", gpus, mp);
      o.dp = static_cast<int>(gpus / mp);
    }
  }
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, gpus));
  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  sim::Calibration calibration;
  if (!f.calibration.empty()) {
    MT_ASSIGN(calibration, sim::load_calibration(f.calibration));
    // Rank threads placed on one node share its cores: a calibration measured
    // with k rank threads running at once on one machine (the cpu backend's
    // local-cpu) times a node of k ranks with the k-level tables. MPI ranks
    // are processes that mpirun binds to cores of their own (Open MPI: a core
    // each for -np <= 2, a socket beyond), so each runs alone on its cores:
    // level 1, as rank 0 of `mpirun -np N meshtrain calibrate` measured it
    // inside its own binding. GPU calibrations measure one rank per device
    // (level 1 only) and are unchanged.
    const std::string comm = f.comm.empty() ? "threads" : f.comm;
    const bool mpi = comm == "mpi";
    if (mpi && std::none_of(calibration.collectives.begin(), calibration.collectives.end(),
                            [](const auto& c) { return c.transport == "mpi"; }))
      return make_error("--comm mpi: calibration '{}' has no collectives measured over MPI; make it "
                        "with `mpirun -np N meshtrain calibrate ...` (its kernels are then also "
                        "measured inside one bound MPI process)", f.calibration);
    const int per_node = mpi ? 1 : std::min(mp.plan.world_size(), options.cluster.gpus_per_node);
    calibration = calibration.for_ranks_sharing(per_node).for_transport(comm);
    MT_TRY(sim::check_calibration_device(calibration, options.cluster)
               .context(fmt::format("--calibration '{}'", f.calibration)));
    sim::apply_link_calibration(calibration, options.cluster);
    options.calibration = &calibration;
  }
  options.trace = !f.trace.empty();
  options.check_memory = !f.ignore_memory;
  MT_ASSIGN(options.attention, attention_impl_from_name(f.attention));
  options.dropout = f.dropout;
  MT_ASSIGN(SimulationResult r, simulate_iteration(mp.model, mp.plan, options));
  if (options.trace) {
    std::FILE* out = std::fopen(f.trace.c_str(), "wb");
    if (out == nullptr) return make_error("cannot write the trace to '{}'", f.trace);
    const bool ok = std::fwrite(r.trace_json.data(), 1, r.trace_json.size(), out) == r.trace_json.size();
    if (std::fclose(out) != 0 || !ok) return make_error("writing the trace to '{}' failed", f.trace);
  }
  // Say which timings came from the calibration and which from the cost model's defaults.
  const sim::CalibrationCoverage coverage = sim::calibration_coverage(
      calibration, mp.plan.precision == Precision::fp32 ? sim::DType::kFp32 : sim::DType::kBf16);
  if (f.json) {
    nlohmann::json j = to_json(r, mp.model, mp.plan, options.cluster);
    if (options.calibration)
      j["calibration"] = {{"file", f.calibration}, {"device", calibration.device},
                          {"measured", coverage.measured}, {"defaults", coverage.defaults}};
    fmt::print("{}\n", j.dump(2));
  } else {
    print_text(r, mp.model, mp.plan, options.cluster);
    if (options.calibration)
      fmt::print("calibration      {} ({}): measured {}; cost-model defaults for {}\n", f.calibration,
                 calibration.device.empty() ? "no device named" : calibration.device,
                 coverage.measured.empty() ? "nothing" : fmt::format("{}", fmt::join(coverage.measured, ", ")),
                 coverage.defaults.empty() ? "nothing" : fmt::format("{}", fmt::join(coverage.defaults, ", ")));
  }
  return {};
}

}  // namespace

Command add_simulate_command(CLI::App& app) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "time one training iteration on a simulated cluster (no model, plan or --gpus: a built-in example)");
  add_plan_flags(*sub, flags->plan, "");
  sub->add_option("--cluster", flags->cluster, "cluster preset name or JSON file")->capture_default_str();
  sub->add_option("--gpus", flags->gpus, "GPUs in the cluster (the plan's world; dp defaults to gpus / (tp·pp·cp))")
      ->check(int_in({1, kMaxWorldSize}));
  sub->add_option("--attention", flags->attention,
                  "attention kernels of the simulated software: flash (fused) or unfused (Megatron-LM 2021: "
                  "score GEMM, softmax, dropout, context GEMM)")
      ->capture_default_str();
  sub->add_option("--dropout", flags->dropout, "dropout probability of the simulated run (hidden states; "
                  "with --attention unfused also the attention probabilities)")
      ->capture_default_str()
      ->check(real_in(kDropoutRange));
  // Output flags do not choose what is simulated: with only those, the example runs.
  std::vector<CLI::Option*> output = {
      sub->add_option("--calibration", flags->calibration, "calibration JSON (meshtrain calibrate) replacing the defaults"),
      sub->add_option("--trace", flags->trace, "write a Chrome trace (open in Perfetto)"),
      sub->add_option("--comm", flags->comm,
                      "with --calibration: use its collectives measured over threads or mpi")
          ->check(CLI::IsMember({"threads", "mpi"})),
      sub->add_flag("--json", flags->json, "print one JSON object"),
      sub->add_flag("--ignore-memory", flags->ignore_memory,
                    "report the timing even when a rank's peak exceeds the device memory")};
  return {sub, [flags, sub, output] {
            std::size_t given = sub->count_all() - 1;
            for (CLI::Option* o : output) given -= o->count();
            return run_simulate(*flags, given == 0);
          }};
}

}  // namespace meshtrain
