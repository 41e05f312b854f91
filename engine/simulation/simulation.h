// One training iteration of a model under a plan, timed on a simulated
// cluster by the sim backend (backends/sim/sim_backend.h). `meshtrain
// simulate` prints it, `meshtrain calibrate --profile` compares it with a
// real step, validate_sim with published runs.
//
// The StepEngine issues the iteration on one SimBackend per class of ranks
// that issue the same ops (rank_classes.h; a uniform plan's pipeline stage,
// represented by its rank with tp 0, dp 0), see the equivalence assumption
// in sim_cluster.h, so the simulated work does not grow with the
// data-parallel degree, for a plan made of segments as for a uniform one.
//
// Reported (per iteration):
//   tokens/s         global batch · seq / iteration time (an image's tokens: its patches)
//   samples/s        global batch / iteration time: sequences, or images (images/s)
//   model TFLOP/s    training_flops(...).model / iteration time / GPUs (models/flops.h);
//                    MFU divides it by the device's dense bf16 peak
//   hardware TFLOP/s the same with recomputation counted
//   idle fraction    per rank, the time its compute stream is idle (neither
//                    computing nor communicating) over the iteration time; the
//                    mean over ranks; `idle` splits it by cause
//                    (simulation_idle.h: pipeline bubble, exposed
//                    data-parallel or model-parallel communication, optimizer)
//   bubble fraction  the pipeline-bubble part of it alone (waiting for
//                    pipeline neighbours, fill and drain): zero without a pipeline
//   exposed comm     per stage, the compute stream's busy time minus its
//                    full-speed compute: communication issued on the compute
//                    stream (which it waits for) and the slowdown concurrent
//                    communication causes; waits for side-stream communication
//                    show up as idle time instead
//
// Full fidelity (SimulateOptions::fidelity, and whenever variation is asked
// for; a plan made of segments then simulates every rank as its own class):
// the representatives still issue the ops, and every rank of a stage
// runs them (sim_cluster.h), a rank (t, d, s) playing for rank r of the
// representative (0, 0, s) the rank with r's coordinates shifted by (t, d):
// its tp group, dp group, pipeline neighbours and embedding partner. What
// the representatives do not show, full fidelity does: contention between
// groups (data-parallel rings and pipeline sends on one NIC), a straggler's
// peers waiting for it, rerouted traffic. It assumes, as representative mode
// does, that the ranks of a stage issue the same ops; they differ only in
// a few tiny ones (tp ranks other than 0 skip replicated parameters in the
// gradient norm's sum of squares).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/memory/memory_model.h"
#include "engine/plan/plan.h"
#include "engine/simulation/simulation_idle.h"
#include "engine/simulation/variation.h"
#include "models/model_spec.h"
#include "models/moe_routing.h"
#include "simulator/cluster_spec.h"

namespace meshtrain {

struct SimulateOptions {
  sim::ClusterSpec cluster;
  const sim::Calibration* calibration = nullptr;  // may be null
  bool trace = false;                             // fill SimulationResult::trace_json
  bool check_memory = true;  // an Error when a rank's peak exceeds the device memory
  // The simulated software stack's kernels and dropout (sim_cluster.h).
  SimulatedKernels kernels;
  // How a model with experts spreads its tokens over them (the sim holds no
  // data to route): models/moe_routing.h.
  MoeRouting moe_routing = MoeRouting::uniform();
  // How the software moves a model's token rows over the expert group (the
  // engine issues the same all-to-all either way; only its cost differs):
  // "alltoall", NCCL's all-to-all of every (token, expert) slot
  // (Megatron-Core's alltoall dispatcher); "deepep" or "hybridep",
  // Megatron-Core's flex dispatcher with that backend, which sends a token
  // once per destination node over the network and once per destination GPU
  // over NVLink, both in bf16 (sim::Algorithm::kDeduplicated).
  std::string moe_dispatcher = "alltoall";
  // Full fidelity is used when asked for or when `variation` is not empty.
  Fidelity fidelity = Fidelity::representative;
  Variation variation;
  bool isolate_exclusive = true;  // SimOptions::isolate_exclusive
  // Steady state: one iteration is simulated, then two, and every
  // per-iteration figure (time, compute, idle and exposed communication,
  // collectives, tasks) is the second run's minus the first's: the second
  // iteration as it runs after a first, whose tail (reductions, updates)
  // may overlap its forward (Plan::overlap_update). The peak memory and the
  // trace are the two-iteration run's.
  bool steady_state = false;
  // The cpu backend's rank threads share this machine's cores (sim::host_sharing_for); off for GPUs.
  sim::HostSharing host_sharing;
};

// A model with experts: its expert parallelism as simulated. The step
// waits for the EP rank whose experts receive the most (the representative
// rank is taken to be it), so skewed routing slows every rank.
struct MoeSimulation {
  std::string routing;  // the --moe-routing spec
  // Per iteration, per MoE layer: assignments routed to each expert (global
  // batch · seq · top_k split by the routing's shares), and max / mean of them.
  std::vector<std::vector<double>> tokens_per_expert;
  double load_max_over_mean = 0;
  // The busiest EP rank's share of its group's assignments over an even share (1: balanced).
  double busiest_rank_load = 0;
  // All-to-all time per iteration (per pipeline stage, mean over stages), and
  // the share of the iteration that the compute stream waits for it. Without
  // EP all-to-all overlap the engine issues the dispatch and combine
  // all-to-alls on the compute stream, so all of it is exposed; with it
  // (Plan::moe_a2a_overlap) they run on the expert-parallel stream, and the
  // exposed part is the compute stream's wait for them (IdleBreakdown::
  // expert_parallel_s, mean over ranks).
  double all_to_all_s = 0, all_to_all_exposed_s = 0, all_to_all_share = 0;
};

std::string_view fidelity_name(Fidelity f);  // "representative" / "full"
Result<Fidelity> fidelity_from_name(std::string_view name);

// "flash" / "unfused", and back; unknown names are an Error listing both.
Result<AttentionImpl> attention_impl_from_name(std::string_view name);
std::string_view attention_impl_name(AttentionImpl a);
// "fused" / "unfused" (sim_cluster.h); unknown names are an Error listing both.
Result<CrossEntropyImpl> cross_entropy_impl_from_name(std::string_view name);

struct StageResult {
  int stage = 0, rank = 0;
  int ranks = 1;  // the ranks this simulated rank stands for (rank_classes.h), itself included
  std::int64_t peak_bytes = 0;  // measured by the sim backend
  std::int64_t host_peak_bytes = 0;  // the same for host memory (offload)
  SimHostWork host_work;    // offload: per iteration, PCIe bytes and seconds, host AdamW seconds
  MemoryBreakdown model;        // the analytic memory model of this stage
  double compute_s = 0, idle_s = 0, exposed_comm_s = 0;
  IdleBreakdown idle;  // idle_s by cause
  std::uint64_t tasks = 0;
};

// A plan made of segments: one segment's or boundary's part of the iteration
// (Backend::set_region), over the ranks that issued work in it.
struct RegionResult {
  std::string name;  // "segment 0 (patch embedding)", "boundary 0", "all segments"
  int ranks = 0;
  double compute_max_s = 0, compute_mean_s = 0;  // issued compute (full speed), per rank
  double sent_bytes = 0;                          // summed over its ranks
  double memory_bytes = 0;                        // segments: the analytic model, the largest of its ranks
};

struct SimulationResult {
  double iteration_s = 0, tokens_per_s = 0, samples_per_s = 0;
  double tflops_per_gpu = 0, hardware_tflops_per_gpu = 0, mfu = 0;
  double bubble_fraction = 0, idle_fraction = 0, exposed_comm_s = 0;
  IdleBreakdown idle;  // per rank, the mean over ranks (seconds)
  std::int64_t peak_memory_bytes = 0;
  int peak_rank = 0;
  std::vector<StageResult> stages;
  std::array<SimCollectiveStats, sim::kNumCollectiveKinds> collectives{};
  std::uint64_t tasks = 0, events = 0;
  std::string trace_json;
  std::optional<MoeSimulation> moe;  // models with experts
  Fidelity fidelity = Fidelity::representative;
  double simulator_wall_s = 0;  // host time of the simulation: issuing the ops and the event run
  // Full fidelity: tasks every rank ran, flows, collectives timed
  // analytically on exclusive links (sim_cluster.h), and the rank whose
  // compute took longest against the median of its class (rank_classes.h: ranks that run
  // the same ops), with that median.
  std::uint64_t tasks_run = 0, flows = 0, isolated_collectives = 0, isolated_overlaps = 0;
  int slowest_rank = -1;
  double slowest_compute_s = 0, median_compute_s = 0;
  std::vector<RegionResult> regions;  // plans made of segments: segments, then boundaries
  // Bytes every rank puts on the wire in one iteration (ring algorithms),
  // summed over ranks; each simulated rank stands for the ranks of its class.
  double sent_bytes = 0;
};

// The calibration in `file` applied to the simulation of a plan of
// `world_size` ranks (`simulate`, `plan`), its collectives those measured
// over `transport` ("threads" or "mpi"). Rank threads placed on one node
// share its cores: a calibration measured with k rank threads running at
// once on one machine (the cpu backend's local-cpu) times a node of k ranks
// with the k-level tables, and lends a waiting rank's cores to the others
// (sim::host_sharing_for). MPI ranks are processes that mpirun binds to
// cores of their own (Open MPI: a core each for -np <= 2, a socket beyond),
// so each runs alone on its cores: level 1, as rank 0 of `mpirun -np N
// meshtrain calibrate` measured it inside its own binding. GPU calibrations
// measure one rank per device (level 1 only) and are unchanged. Then the
// calibration's device is checked against the cluster's, its precision
// against the run's `precision` (a calibration of another precision is
// refused: sim::check_calibration_precision), and its measured links
// applied. `calibration` receives the tables and must outlive `options`.
Status apply_calibration(const std::string& file, const std::string& transport, int world_size, Precision precision,
                         sim::Calibration& calibration, SimulateOptions& options);

// Validates that the step engine supports `p` and that the cluster has room,
// then simulates one iteration.
Result<SimulationResult> simulate_iteration(const ModelSpec& m, const Plan& p,
                                            const SimulateOptions& options);

// Building blocks for several jobs on one cluster (shared_fabric.h).
// The job of plan `p` (representatives one per class, rank_classes.h; in full fidelity their
// classes and the rank map above), placed on `gpus` (empty: rank r on GPU r).
SimJob simulation_job(const Plan& p, bool full, std::map<int, double> stragglers, std::vector<int> gpus = {});
SimOptions simulation_options(const SimulateOptions& options, bool full);
// Issues `iterations` iterations of job `job` on its representatives.
Status issue_iterations(SimCluster& cluster, int job, const ModelSpec& m, const Plan& p,
                        const SimulateOptions& options, int iterations);

}  // namespace meshtrain
