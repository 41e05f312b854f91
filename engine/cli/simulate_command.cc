// `meshtrain simulate`: parses the flags, runs one simulated iteration
// (engine/simulation/simulation.h) and prints it as text or JSON.
#include <algorithm>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/host_memory.h"
#include "core/input_file.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/cli/simulate_jobs.h"
#include "engine/memory/memory_model.h"
#include "engine/memory/out_of_memory.h"
#include "engine/pictures/pictures.h"
#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "engine/simulation/simulation.h"
#include "engine/step/step_engine.h"
#include "models/model_io.h"
#include "simulator/calibration.h"

namespace meshtrain {

namespace {

struct SimulateFlags {
  PlanFlags plan;
  std::string cluster = "dgx-a100";
  std::optional<int> gpus;  // unset: the plan's world
  std::string calibration, trace;
  std::string svg;   // --svg FILE: the step's timeline and memory per rank (engine/pictures/pictures.h)
  std::string comm;  // which measured collectives apply: "threads" (the default) or "mpi"
  bool json = false;
  bool ignore_memory = false;
  bool steady_state = false;
  SoftwareFlags software;  // the simulated software stack
  // What-ifs (engine/simulation/variation.h); any of them means full fidelity.
  std::string fidelity = "representative";
  std::vector<std::string> stragglers, link_degrade, link_fail;
  std::uint64_t seed = 1;
  std::vector<std::string> jobs;  // --job FILE: several jobs on one cluster
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

// The compute stream's idle seconds by cause (simulation_idle.h).
nlohmann::json idle_json(const IdleBreakdown& b) {
  return {{"pipeline_bubble_s", b.pipeline_s}, {"data_parallel_s", b.data_parallel_s},
          {"model_parallel_s", b.model_parallel_s}, {"optimizer_s", b.optimizer_s}, {"other_s", b.other_s}};
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
                      {"ranks", s.ranks},
                      {"peak_memory_bytes", s.peak_bytes},
                      {"model_memory_bytes", s.model.total()},
                      {"offloaded_bytes", s.model.offloaded},
                      {"host_peak_memory_bytes", s.host_peak_bytes},
                      {"pcie_bytes", s.host_work.copy_bytes},
                      {"pcie_s", s.host_work.copy_s},
                      {"host_adamw_s", s.host_work.adamw_s},
                      {"compute_s", s.compute_s},
                      {"idle_s", s.idle_s},
                      {"idle", idle_json(s.idle)},
                      {"exposed_comm_s", s.exposed_comm_s},
                      {"tasks", s.tasks}});
  nlohmann::json out = {{"model", m.name},
          {"cluster", c.name},
          {"gpus", p.world_size()},
          {"plan", plan_to_json(p)},
          {"iteration_time_s", r.iteration_s},
          {"tokens_per_s", r.tokens_per_s},
          {"tflops_per_gpu", r.tflops_per_gpu},
          {"hardware_tflops_per_gpu", r.hardware_tflops_per_gpu},
          {"mfu", r.mfu},
          {"bubble_fraction", r.bubble_fraction},
          {"idle_fraction", r.idle_fraction},
          {"idle", idle_json(r.idle)},
          {"exposed_comm_s", r.exposed_comm_s},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"peak_memory_rank", r.peak_rank},
          {"device_memory_bytes", c.device.memory_bytes},
          {"collectives", collectives},
          {"sent_bytes", r.sent_bytes},
          {"stages", stages},
                      {"tasks", r.tasks},
          {"events", r.events},
          {"fidelity", fidelity_name(r.fidelity)},
          {"simulator_wall_s", r.simulator_wall_s}};
  if (model_io(m).unit() == "image") out["images_per_s"] = r.samples_per_s;
  if (!r.regions.empty()) {
    nlohmann::json regions = nlohmann::json::array();
    for (const RegionResult& g : r.regions)
      regions.push_back({{"name", g.name},
                         {"ranks", g.ranks},
                         {"compute_max_s", g.compute_max_s},
                         {"compute_mean_s", g.compute_mean_s},
                         {"compute_share", g.compute_max_s / r.iteration_s},
                         {"sent_bytes", g.sent_bytes},
                         {"memory_bytes", g.memory_bytes}});
    out["segments"] = std::move(regions);
  }
  if (r.moe)
    out["moe"] = {{"routing", r.moe->routing},
                  {"all_to_all_s", r.moe->all_to_all_s},
                  {"all_to_all_exposed_s", r.moe->all_to_all_exposed_s},
                  {"all_to_all_share", r.moe->all_to_all_share},
                  {"expert_load_max_mean", r.moe->load_max_over_mean},
                  {"busiest_ep_rank_load", r.moe->busiest_rank_load},
                  {"tokens_per_expert", r.moe->tokens_per_expert}};
  if (r.fidelity == Fidelity::full)
    out["full_fidelity"] = {{"tasks_run", r.tasks_run},
                            {"flows", r.flows},
                            {"isolated_collectives", r.isolated_collectives},
                            {"isolated_overlaps", r.isolated_overlaps},
                            {"slowest_rank", r.slowest_rank},
                            {"slowest_compute_s", r.slowest_compute_s},
                            {"median_compute_s", r.median_compute_s}};
  return out;
}

// The plan: its layers' layout by segment (a plan made of segments), or its degrees.
void print_heading(const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  if (!p.segments.empty()) {
    // The layout by segment; the table below is then by rank.
    fmt::print("simulated {} on {} x {} ({}): {} segments, global batch {}, {}\n{}", m.name, p.world_size(),
               c.device.name, c.name, p.segments.size(), p.effective_global_batch(), precision_label(p),
               describe_segments(p, m));
  } else {
    fmt::print("simulated {} on {} x {} ({}): tp {} pp {} dp {} vpp {} zero {}, micro-batch {}, global batch {}, "
               "schedule {}, recompute {}, {}\n",
               m.name, p.world_size(), c.device.name, c.name, p.tp, p.pp, p.dp, p.vpp, p.zero, p.micro_batch,
               p.effective_global_batch(), schedule_name(p.schedule) + (p.overlap_p2p_comm ? " (p2p overlapped)" : ""),
               recompute_label(p), precision_label(p));
  }
}

// Iteration time, throughput, FLOP rates and idle time by cause.
void print_rates(const SimulationResult& r, const ModelSpec& m, const sim::ClusterSpec& c) {
  fmt::print("iteration        {:.4f} s\n", r.iteration_s);
  if (model_io(m).unit() == "image") fmt::print("throughput       {:.1f} images/s ({:.0f} tokens/s)\n", r.samples_per_s, r.tokens_per_s);
  else fmt::print("throughput       {:.0f} tokens/s\n", r.tokens_per_s);
  fmt::print("model FLOP/s     {:.1f} TFLOP/s per GPU, MFU {:.1f}% (of {:.0f} TFLOP/s bf16 peak)\n",
             r.tflops_per_gpu, 100 * r.mfu, c.device.peak_bf16_flops / 1e12);
  fmt::print("hardware FLOP/s  {:.1f} TFLOP/s per GPU\n", r.hardware_tflops_per_gpu);
  fmt::print("idle             {:.1f}% of the iteration (compute stream idle, mean over ranks)\n",
             100 * r.idle_fraction);
  const auto share = [&](double s) { return fmt::format("{:.4f} s ({:.1f}%)", s, 100 * s / r.iteration_s); };
  fmt::print("  pipeline bubble          {}\n", share(r.idle.pipeline_s));
  fmt::print("  exposed data-parallel    {}\n", share(r.idle.data_parallel_s));
  fmt::print("  exposed TP/CP/EP comm    {}\n", share(r.idle.model_parallel_s));
  fmt::print("  optimizer                {}\n", share(r.idle.optimizer_s));
  if (r.idle.other_s > 0) fmt::print("  other                    {}\n", share(r.idle.other_s));
  fmt::print("exposed comm     {:.4f} s per stage (mean)\n", r.exposed_comm_s);
}

// Memory peak, then one line per simulated rank; offload's host side; segments and boundaries.
void print_ranks(const SimulationResult& r, const Plan& p, const sim::ClusterSpec& c) {
  fmt::print("memory           peak {} on rank {} (device {})\n", human_bytes(static_cast<double>(r.peak_memory_bytes)),
             r.peak_rank, human_bytes(c.device.memory_bytes));
  // One line per simulated rank, standing for the `ranks` of its class.
  fmt::print("  {:>5} {:>6} {:>6} {:>12} {:>12} {:>10} {:>10}\n", "stage", "rank", "ranks", "peak", "model",
             "compute s", "idle s");
  for (const StageResult& s : r.stages)
    fmt::print("  {:>5} {:>6} {:>6} {:>12} {:>12} {:>10.4f} {:>10.4f}\n", s.stage, s.rank, s.ranks,
               human_bytes(static_cast<double>(s.peak_bytes)), human_bytes(s.model.total()), s.compute_s, s.idle_s);
  if (p.offload != Offload::none) {
    // Per stage: what the device no longer holds, the host memory that holds it, and the step's host work
    // (on its own streams: it overlaps compute only where the schedule leaves room).
    fmt::print("offload          {}: device memory saved, host memory used, and per iteration the PCIe "
               "traffic and host AdamW time\n  {:>5} {:>12} {:>12} {:>12} {:>10} {:>10}\n",
               offload_name(p.offload), "stage", "saved", "host", "PCIe", "PCIe s", "host s");
    for (const StageResult& s : r.stages)
      fmt::print("  {:>5} {:>12} {:>12} {:>12} {:>10.4f} {:>10.4f}\n", s.stage, human_bytes(s.model.offloaded),
                 human_bytes(static_cast<double>(s.host_peak_bytes)), human_bytes(s.host_work.copy_bytes),
                 s.host_work.copy_s, s.host_work.adamw_s);
  }
  if (!r.regions.empty()) {
    // Segments: compute of their busiest rank (and its share of the iteration: the rest of that rank's
    // time is other segments, communication waits and bubbles), bytes sent, analytic memory.
    fmt::print("by segment and boundary\n  {:<34} {:>5} {:>10} {:>7} {:>10} {:>12} {:>12}\n", "", "ranks",
               "compute s", "share", "mean s", "sent", "memory");
    for (const RegionResult& g : r.regions)
      fmt::print("  {:<34} {:>5} {:>10.4f} {:>6.1f}% {:>10.4f} {:>12} {:>12}\n", g.name, g.ranks, g.compute_max_s,
                 100 * g.compute_max_s / r.iteration_s, g.compute_mean_s, human_bytes(g.sent_bytes),
                 g.memory_bytes > 0 ? human_bytes(g.memory_bytes) : std::string("-"));
  }
}

// Each collective kind's calls, time and bytes.
void print_communication(const SimulationResult& r) {
  fmt::print("communication (each collective counted once; all ranks sent {} this iteration)\n",
             human_bytes(r.sent_bytes));
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    const SimCollectiveStats& s = r.collectives[static_cast<std::size_t>(k)];
    if (s.count == 0) continue;
    fmt::print("  {:<15} {:>8} calls {:>10.4f} s {:>12}\n", sim::collective_kind_name(static_cast<sim::CollectiveKind>(k)),
               s.count, s.time_s, human_bytes(s.bytes));
  }
}

// A mixture of experts' all-to-all, load and tokens per expert.
void print_experts(const SimulationResult& r, const ModelSpec& m, const Plan& p) {
  const MoeSimulation& e = *r.moe;
  fmt::print("experts          {} per MoE layer, top {}, ep {} etp {}; routing {}\n", m.experts, m.top_k, p.ep,
             p.expert_tp(), e.routing);
  fmt::print("  all-to-all     {:.4f} s per stage, exposed {:.4f} s = {:.1f}% of the iteration\n", e.all_to_all_s,
             e.all_to_all_exposed_s, 100 * e.all_to_all_share);
  fmt::print("  load           max/mean tokens per expert {:.2f}; busiest EP rank {:.2f}x an even share\n",
             e.load_max_over_mean, e.busiest_rank_load);
  if (!e.tokens_per_expert.empty()) {
    const std::vector<double>& first = e.tokens_per_expert.front();
    std::string list;
    if (first.size() <= 16)
      for (double t : first) list += fmt::format(" {:.0f}", t);
    else
      list = fmt::format(" {:.0f} (expert 0) ... {:.0f} (expert {}); --json lists all", first.front(), first.back(),
                         first.size() - 1);
    fmt::print("  tokens/expert  per iteration, first MoE layer:{}\n", list);
  }
}

// The simulator's own work, and under full fidelity the slowest rank.
void print_simulator(const SimulationResult& r, const Plan& p) {
  fmt::print("simulator        {} tasks, {} events, {:.2f} s\n", r.tasks, r.events, r.simulator_wall_s);
  if (r.fidelity != Fidelity::full) return;
  fmt::print("full fidelity    {} ranks ran {} tasks, {} flows; {} collectives on exclusive links or latency-bound "
             "timed analytically{}\n",
             p.world_size(), r.tasks_run, r.flows, r.isolated_collectives,
             r.isolated_overlaps ? fmt::format(" ({} overlapped)", r.isolated_overlaps) : std::string());
  fmt::print("slowest rank     {} computes {:.4f} s, the median rank of its class {:.4f} s (+{:.1f}%)\n", r.slowest_rank,
             r.slowest_compute_s, r.median_compute_s,
             r.median_compute_s > 0 ? 100 * (r.slowest_compute_s / r.median_compute_s - 1) : 0.0);
}

void print_text(const SimulationResult& r, const ModelSpec& m, const Plan& p, const sim::ClusterSpec& c) {
  print_heading(m, p, c);
  print_rates(r, m, c);
  print_ranks(r, p, c);
  print_communication(r);
  if (r.moe) print_experts(r, m, p);
  print_simulator(r, p);
}

// "tp 2 pp 2 dp 2 mb 4 1f1b": the plan in a picture's title.
std::string describe_plan_short(const Plan& p) {
  if (!p.segments.empty()) return fmt::format("{} segments", p.segments.size());
  return fmt::format("tp {} pp {} dp {} vpp {} zero {}, micro-batch {}, {}", p.tp, p.pp, p.dp, p.vpp, p.zero,
                     p.micro_batch, schedule_name(p.schedule));
}

// The what-if flags that do not depend on the plan.
Status apply_link_flags(const SimulateFlags& f, SimulateOptions& options) {
  for (const std::string& spec : f.link_degrade) {
    MT_ASSIGN(LinkChange change, parse_link_degrade(spec));
    MT_TRY(add_link_change(options.variation, std::move(change)));
  }
  for (const std::string& cable : f.link_fail) MT_TRY(add_link_change(options.variation, link_failure(cable)));
  return {};
}

// Flags that choose the machine but not what runs on it: name what is missing.
Error missing_model(const SimulateFlags& f) {
  std::string presets;
  for (const std::string& name : model_preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  return make_error("no model to simulate on cluster '{}': add --model NAME|FILE (a JSON model file, or a preset: "
                    "{}), e.g. `meshtrain simulate --cluster {} --model gpt2-124m --gpus 8`; with no flags at "
                    "all, simulate runs its built-in example (megatron-18.4b on 64 DGX A100 GPUs)",
                    f.cluster, presets, f.cluster);
}

// A plan of no plan flags (but --gpus) and no plan file is the default one
// (every GPU data-parallel, ZeRO 0, no recomputation): where its most loaded stage
// cannot fit the device by the memory model, say so before simulating, and
// point at the planner, which searches for a plan that fits.
Status check_default_plan_fits(const SimulateFlags& f, const ModelAndPlan& mp, const sim::ClusterSpec& c) {
  const PlanOverrides& o = f.plan.overrides;
  const bool chosen = !f.plan.plan_file.empty() || o.tp || o.pp || o.cp || o.ep || o.vpp || o.zero || o.recompute ||
                      o.recompute_modules ||
                      o.offload || o.sequence_parallel || o.micro_batch || o.global_batch || o.microbatches ||
                      o.seq_len || o.precision;
  if (chosen || !mp.plan.segments.empty()) return ok_status();
  MemoryBreakdown peak;
  int peak_stage = 0;
  for (int stage = 0; stage < mp.plan.pp; ++stage) {
    MemoryBreakdown b = memory_per_rank(mp.model, mp.plan, stage, meshtrain_layout(mp.plan));
    if (stage == 0 || b.total() > peak.total()) peak = b, peak_stage = stage;
  }
  if (peak.total() <= c.device.memory_bytes) return ok_status();
  OutOfMemory oom;
  oom.rank = Mesh(mp.plan).rank_of({0, 0, 0, peak_stage});
  oom.where = fmt::format("pipeline stage {}, and every rank of that stage", peak_stage);
  oom.peak = peak.total();
  oom.capacity = c.device.memory_bytes;
  oom.capacity_of = fmt::format("the {}", c.device.name);
  oom.consumers = memory_consumers(peak);
  oom.fix = fmt::format("Let the planner find a plan that fits: `meshtrain plan --model {} --gpus {} --cluster {}` (its "
                      "--out FILE feeds simulate --plan), or give --tp, --pp, --zero or --recompute yourself "
                      "(--ignore-memory times it anyway)",
                      f.plan.model, mp.plan.world_size(), f.cluster);
  return make_error("the default plan (tp 1 pp {} dp {}, ZeRO 0, no recomputation) does not fit {}: {}", mp.plan.pp,
                    mp.plan.dp, mp.model.name, out_of_memory_message(oom));
}

Status run_jobs(const SimulateFlags& f) {
  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  MT_TRY(apply_software_flags(f.software, options));
  MT_TRY(apply_link_flags(f, options));
  if (!f.stragglers.empty()) return make_error("--straggler names ranks of one job; it does not combine with --job");
  if (!f.svg.empty()) return make_error("--svg draws one job's step; it does not combine with --job (simulate each job alone)");
  return run_simulate_jobs(f.jobs, options, f.gpus.value_or(0), f.json);
}

Status run_simulate(SimulateFlags f, bool no_flags) {
  if (!f.jobs.empty()) return run_jobs(f);
  if (no_flags) use_example(f);
  if (f.plan.model.empty()) return missing_model(f);
  if (f.calibration.empty() && !f.comm.empty())
    return make_error("--comm {} chooses which measured collectives of --calibration apply; without "
                      "--calibration it does nothing: add --calibration FILE or drop --comm", f.comm);
  const int gpus = f.gpus.value_or(0);
  MT_TRY(dp_from_gpus(f.plan, gpus));
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, gpus));
  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  if (!f.ignore_memory) MT_TRY(check_default_plan_fits(f, mp, options.cluster));
  sim::Calibration calibration;
  if (!f.calibration.empty())
    MT_TRY(apply_calibration(f.calibration, f.comm.empty() ? "threads" : f.comm, mp.plan.world_size(),
                             mp.plan.precision, calibration, options));
  // The picture's timeline is drawn from the same trace --trace writes.
  options.trace = !f.trace.empty() || !f.svg.empty();
  if (!f.trace.empty()) MT_TRY(probe_output_file(f.trace, "--trace file"));  // before the simulation, not after
  if (!f.svg.empty()) MT_TRY(probe_output_file(f.svg, "--svg picture"));
  options.check_memory = !f.ignore_memory;
  options.steady_state = f.steady_state;
  MT_TRY(apply_software_flags(f.software, options));
  MT_ASSIGN(options.fidelity, fidelity_from_name(f.fidelity));
  MT_ASSIGN(options.variation.stragglers, parse_stragglers(f.stragglers, mp.plan.world_size(), f.seed));
  MT_TRY(apply_link_flags(f, options));
  if (!options.variation.stragglers.empty())
    fmt::print(stderr, "stragglers: {}\n", describe_stragglers(options.variation.stragglers));
  MT_ASSIGN(SimulationResult r, simulate_iteration(mp.model, mp.plan, options));
  if (!f.trace.empty()) MT_TRY(write_output_file(f.trace, r.trace_json, "--trace file"));
  if (!f.svg.empty()) {
    MT_ASSIGN(pictures::Timeline timeline, pictures::timeline_from_trace(r.trace_json));
    const std::string title = fmt::format("{} on {} x {}: {}", mp.model.name, mp.plan.world_size(),
                                          options.cluster.device.name, describe_plan_short(mp.plan));
    MT_TRY(write_output_file(f.svg, pictures::simulation_svg(timeline, r, options.cluster.device.memory_bytes, title),
                             "--svg picture"));
  }
  // Say which timings came from the calibration and which from the cost model's defaults.
  const sim::CalibrationCoverage coverage = sim::calibration_coverage(
      calibration, mp.plan.precision == Precision::fp32   ? sim::DType::kFp32
                   : mp.plan.precision == Precision::fp8 ? sim::DType::kFp8
                                                         : sim::DType::kBf16);
  if (f.json) {
    nlohmann::json j = to_json(r, mp.model, mp.plan, options.cluster);
    j["what_ifs"] = describe_variation(options.variation);
    if (options.calibration)
      j["calibration"] = {{"file", f.calibration}, {"device", calibration.device},
                          {"measured", coverage.measured}, {"defaults", coverage.defaults}};
    fmt::print("{}\n", j.dump(2));
  } else {
    print_text(r, mp.model, mp.plan, options.cluster);
    for (const std::string& what_if : describe_variation(options.variation)) fmt::print("what-if          {}\n", what_if);
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
  add_cluster_flags(*sub, flags->cluster, flags->gpus,
                    "GPUs in the cluster (the plan's world; dp defaults to gpus / (tp·pp·cp))");
  add_software_flags(*sub, flags->software);
  sub->add_option("--fidelity", flags->fidelity,
                  "representative (a few ranks per class of ranks that act alike: a uniform plan's pipeline "
                  "stages) or full (every rank's ops and flows; used whenever a straggler or link what-if is given)")
      ->capture_default_str();
  sub->add_option("--straggler", flags->stragglers,
                  "RANKS:FACTOR (17:1.3, 3,5,8-11:1.5) or random:P:FACTOR: those ranks' kernels take FACTOR times "
                  "as long; repeatable");
  sub->add_option("--link-degrade", flags->link_degrade,
                  "CABLE:FACTOR: the cable (node3.nic5, leaf2-spine7, node0.gpu3, node1.pcie2) keeps FACTOR of its "
                  "bandwidth; repeatable");
  sub->add_option("--link-fail", flags->link_fail,
                  "CABLE: the cable is down; traffic reroutes, or the job stops without a path; repeatable");
  sub->add_option("--seed", flags->seed, "seed of random:P:FACTOR stragglers")
      ->capture_default_str()
      ->check(uint64_up_to(std::numeric_limits<std::uint64_t>::max()));
  sub->add_option("--job", flags->jobs,
                  "a job file (model, plan, GPUs); two or more share the cluster, each is also run alone and its "
                  "slowdown reported; repeatable");
  sub->add_flag("--steady-state", flags->steady_state,
                "time the second of two iterations (what overlaps the next step's forward counts), not one alone");
  // Output flags do not choose what is simulated: with only those, the example runs.
  std::vector<CLI::Option*> output = {
      sub->add_option("--calibration", flags->calibration, "calibration JSON (meshtrain calibrate) replacing the defaults"),
      sub->add_option("--trace", flags->trace, "write a Chrome trace (open in Perfetto)"),
      sub->add_option("--svg", flags->svg,
                      "write an SVG picture: the step's timeline per rank (compute, communication, idle by cause) "
                      "above the memory per rank against the device capacity"),
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
