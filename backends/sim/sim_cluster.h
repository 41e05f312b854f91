// The simulated cluster behind the sim backend (sim_backend.h): one
// discrete-event simulation (simulator/executor.h) of a cluster of GPUs, the
// representative ranks that issue work on it, and the report of a run.
//
// A SimCluster owns one simulated cluster and its Executor and hands out one
// SimBackend per REPRESENTATIVE rank. The engine drives each representative
// exactly as it drives a real rank; because no op blocks on data (read()
// returns zeros at once), the representatives can be driven one after another
// on one host thread, and run() then times everything they issued together.
//
// Equivalence assumption (why representatives suffice): ranks that differ only
// in their tensor-parallel index or their data-parallel replica issue the same
// ops with the same shapes in the same order (Megatron-style TP splits every
// layer evenly; replicas run the same schedule on different data). Such ranks
// start every op at the same time, so a collective among them starts when the
// representative reaches it, and its duration is the collective's analytic
// time over the FULL member list, placed on the real GPUs of those ranks
// (global rank r runs on GPU r, so a tp group shares a node's NVSwitch). The
// caller picks one representative per class of identical ranks, e.g. one per
// pipeline stage (tp 0, dp 0). Memory and simulated work then grow with the
// number of stages and ops, not with ranks × ops. What the assumption drops:
// contention between a representative's collectives and the traffic of ranks
// that are not simulated (their flows are not on the network), and skew
// between replicas.
//
// Full fidelity (Fidelity::full) drops the assumption and keeps its economy.
// The representatives still issue every op once, but each rank of a
// representative's class runs those op streams itself (sim::Executor's
// replicas): every rank's ops and every flow are on the network, collectives
// start when their slowest member arrives, and contention between groups
// shows. The caller names each class and how a representative's ranks map
// onto a member's (SimJob::replicas, rank_map); ranks that are not
// representatives get no backend. Variation needs it: a straggler
// (SimJob::stragglers: a rank whose compute takes longer) and degraded or
// failed cables (SimOptions::links, named as in simulator/topology.h).
//
// Jobs: a cluster can run several jobs at once (create with a list of
// SimJob), each with its own ranks, groups and placement on the GPUs
// (SimJob::gpus; by default rank r on GPU r), sharing the network. Group ids
// and ranks are each job's own. SimReport::jobs tells each job's iteration.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "simulator/calibration.h"
#include "simulator/cluster_spec.h"
#include "simulator/collective.h"
#include "simulator/cost_model.h"
#include "simulator/executor.h"
#include "simulator/host_sharing.h"
#include "simulator/topology.h"

namespace meshtrain {

class SimBackend;

// Which attention kernels the simulated software stack runs: a fact of the
// system being simulated (what its framework did in the measured year), not
// a tuning knob. The engine issues one attention op either way; only its
// timing differs.
enum class AttentionImpl {
  // One fused kernel (FlashAttention-2, 2023): CostModel::attention; the
  // b·a·s² scores never leave on-chip memory, causal halves the work.
  flash,
  // Megatron-LM before FlashAttention (its 2021 runs): a batched GEMM writes
  // the (b·a, s, s) scores to HBM, a fused scale-mask-softmax kernel reads
  // and writes them, attention dropout (when the run used it) reads them and
  // writes them and a 1-byte mask, a second batched GEMM reads them. GEMMs
  // cover the full s×s (the causal mask is applied, not skipped). Backward:
  // dV = Pᵀ·dO and dP = dO·Vᵀ (GEMMs), dropout backward (read dP and the
  // mask, write), softmax backward (read dP and P, write dS), dQ = dS·K and
  // dK = dSᵀ·Q (GEMMs). Only time is modelled: the sim backend's memory is
  // that of the engine's tensors, which keep no s×s buffer.
  unfused,
};

// How the simulated software computes the language-model loss over the
// (rows, vocab) logits. The engine issues the same cross-entropy ops either
// way; only their timing differs.
enum class CrossEntropyImpl {
  // Fused kernels reading the 16-bit logits: a pass for the row maxima,
  // one for the sums of exponentials, and one reading them again to write
  // the gradient (Megatron-Core's --cross-entropy-loss-fusion, Transformer
  // Engine's and Apex's fused losses).
  fused,
  // Megatron's vocab-parallel cross-entropy in PyTorch ops, the default
  // before --cross-entropy-loss-fusion (megatron/core/tensor_parallel/
  // cross_entropy.py of core_r0.8.0; Megatron-LM 2021 alike): the logits
  // are cast to fp32 (read 16-bit, write fp32), then, each a kernel over
  // the fp32 copy, the max (read), the max subtracted in place (read,
  // write), exp in place (read, write), the sum (read), the softmax
  // normalized in place (read, write); backward scales the softmax by the
  // loss gradient in place (read, write) and casts it back to 16 bits
  // (read fp32, write 16-bit). 52 bytes per logit with bf16 logits, against
  // the fused kernels' 8. Only time is modelled, as for unfused attention.
  unfused,
};

enum class Fidelity { representative, full };

// A cable (simulator/topology.h names) at `factor` of its bandwidth, or failed.
struct LinkChange {
  std::string cable;
  double factor = 1;
  bool fail = false;
};

// The simulated software's kernels where the engine issues one op either
// way: facts of the system simulated (e.g. of a published run being
// reproduced), which simulate's flags and the validation tables set.
struct SimulatedKernels {
  AttentionImpl attention = AttentionImpl::flash;
  CrossEntropyImpl cross_entropy = CrossEntropyImpl::fused;
  // Whether the simulated software runs a layer's local experts as one
  // grouped GEMM (Megatron-Core's --moe-grouped-gemm: GroupedMLP or
  // TEGroupedMLP) or one GEMM per expert in turn (SequentialMLP, its default
  // without the flag). The engine issues the same grouped op either way.
  bool moe_grouped_gemm = true;
  // The run's dropout probability: the engine's dropout kernels on hidden
  // states, and with AttentionImpl::unfused a kernel on the attention
  // probabilities too (0: none). Flash attention fuses the latter.
  float dropout = 0.f;
};

struct SimOptions {
  bool trace = false;  // collect a Chrome trace (SimCluster::trace())
  SimulatedKernels kernels;
  // How collectives among representatives are timed (flows see contention).
  sim::CollectiveMode mode = sim::CollectiveMode::kFlows;
  const sim::Calibration* calibration = nullptr;  // may be null; must outlive the cluster
  Fidelity fidelity = Fidelity::representative;
  // Full fidelity: time the collectives of groups alone on their links
  // analytically and merge back-to-back compute (sim::ExecutorOptions); off,
  // every collective is flows (slower; for checking the shortcut).
  bool isolate_exclusive = true;
  std::vector<LinkChange> links;  // applied in order; full fidelity only
  // The cpu backend's rank threads share the machine's cores (simulator/host_sharing.h); off for GPUs.
  sim::HostSharing host_sharing;
};

// One job on the cluster (see "Jobs" above).
struct SimJob {
  int world_size = 0;
  std::vector<int> representatives;  // distinct ranks that get a backend
  std::vector<int> gpus;             // by rank; empty: rank r on GPU r
  // Full fidelity: by representative index, the other ranks of its class,
  // and rank_map(representative, member, r): the rank that plays, for
  // `member`, the part rank r plays for the representative.
  std::vector<std::vector<int>> replicas;
  std::function<int(int representative, int member, int rank)> rank_map;
  std::map<int, double> stragglers;  // rank -> compute factor (1.3: 30% slower); full only
  // Representative fidelity, by representative: how many ranks it stands
  // for, itself included (their host cores it shares, SimOptions::host_sharing).
  // Empty: the world split evenly among the representatives.
  std::vector<int> stands_for;
  // The representatives are the pipeline stages of a uniform plan (with
  // their replicas, the ranks of each stage): a collective over ranks of
  // different stages is named with kAcrossStages, so that a wait for its
  // members (stages still in their schedule) reads as the pipeline's.
  bool stages = false;
  // The same for a plan made of segments, by rank: the ranks holding the
  // same pipeline stage of every segment share a number (empty: none).
  std::vector<int> stage_of;
};

// The suffix of a collective's task name when its members sit on different
// pipeline stages (SimJob::stages), e.g. "all_reduce across stages".
inline constexpr std::string_view kAcrossStages = " across stages";

// Offload: bytes copied between a GPU and host memory, and the seconds of
// those copies and of the host's AdamW updates, as issued.
struct SimHostWork {
  double copy_bytes = 0, copy_s = 0, adamw_s = 0;
};

// Per representative rank, after run().
struct SimRankReport {
  int rank = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t host_peak_bytes = 0;  // host memory (Backend::host_zeros)
  SimHostWork host_work;             // offload: PCIe copies and host updates issued
  double compute_s = 0;         // sum of issued compute durations (full speed), every stream
  double compute_stream_s = 0;  // the part of compute_s issued on the default stream
  double compute_busy_s = 0;    // busy time of the default stream (compute + comm issued on it)
  double idle_s = 0;          // iteration time minus that busy time
  std::vector<sim::IdleCause> idle_causes;  // the default stream's idle time by what it waited for
  std::uint64_t tasks = 0;
  // Per region (Backend::set_region): issued compute seconds and bytes sent.
  std::map<std::string, std::pair<double, double>> regions;
};

struct SimCollectiveStats {
  double time_s = 0;  // summed durations, each collective counted once
  std::uint64_t count = 0;
  double bytes = 0;  // summed nccl-tests sizes
};

// Per job, after run().
struct SimJobReport {
  double iteration_s = 0;  // when the job's last task finished
  // Full fidelity, by rank: time its compute ran (at the speed it ran, so a
  // straggler's is longer) and when its last task finished.
  std::vector<double> compute_s, end_s;
};

struct SimReport {
  double iteration_s = 0;            // makespan of everything issued
  std::vector<SimRankReport> ranks;  // the representatives, job by job, in their given order
  std::vector<SimJobReport> jobs;
  std::array<SimCollectiveStats, sim::kNumCollectiveKinds> collectives{};
  std::uint64_t tasks = 0;  // tasks recorded on the executor, all streams
  std::uint64_t events = 0;
  // Full fidelity: tasks executed by every rank, network flows, collectives
  // timed analytically (exclusive links or latency-bound) and the overlaps
  // of those (sim::RunReport).
  std::uint64_t tasks_run = 0, flows = 0, isolated_collectives = 0, isolated_overlaps = 0;
};

class SimCluster {
 public:
  // A cluster of `world_size` GPUs of `spec` running one job; rank r is GPU
  // r. Only `representatives` (distinct global ranks) get a backend.
  static Result<std::unique_ptr<SimCluster>> create(const sim::ClusterSpec& spec, int world_size,
                                                    std::vector<int> representatives,
                                                    SimOptions options = {});
  // A cluster of `num_gpus` GPUs running `jobs` (see "Jobs").
  static Result<std::unique_ptr<SimCluster>> create_jobs(const sim::ClusterSpec& spec, int num_gpus,
                                                         std::vector<SimJob> jobs, SimOptions options = {});
  ~SimCluster();

  const std::vector<int>& representatives(int job = 0) const { return jobs_[static_cast<std::size_t>(job)].representatives; }
  // Aborts for a rank that is not a representative.
  SimBackend& backend(int global_rank) { return backend(0, global_rank); }
  SimBackend& backend(int job, int rank);
  const sim::Cluster& cluster() const { return cluster_; }
  const sim::CostModel& cost_model() const { return cost_; }

  // Times everything issued so far. Single use, like the executor.
  Result<SimReport> run();
  const sim::Trace& trace() const { return executor_->trace(); }

 private:
  friend class SimBackend;
  SimCluster(sim::Cluster cluster, const sim::ClusterSpec& spec, std::vector<SimJob> jobs,
             SimOptions options);

  bool full() const { return options_.fidelity == Fidelity::full; }
  bool simulated(int job, int rank) const { return full() || rep_index_.count({job, rank}) != 0; }
  int gpu(int job, int rank) const;
  // Whether `g` holds ranks of two pipeline stages or more (SimJob::stages).
  bool across_stages(int job, const Group& g) const;
  void fail(Error e);
  // Hands every non-representative rank its class's op streams (full fidelity).
  Status replicate();
  // A copy of `bytes` between a GPU of a job of `world_size` ranks and host
  // memory: over the GPU's PCIe switch's host link, shared by the job's GPUs
  // behind that switch (they offload at the same moments), at
  // pcie_copy_efficiency of the line rate unless a calibration measured it.
  sim::Time host_copy(double bytes, int world_size) const;
  // How many ranks of a job of `world_size` share one node's host CPUs.
  int host_sharing(int world_size) const { return std::min(spec_.gpus_per_node, world_size); }
  // The analytic duration of `request` (cached by kind, bytes and members).
  Result<sim::Time> analytic(const sim::CollectiveRequest& request);
  // Issues collective `request` over `group` from `rank` of `job` on
  // executor stream `stream`.
  void collective(int job, int rank, sim::StreamId stream, const Group& group,
                  sim::CollectiveRequest request);
  void point_to_point(int job, int rank, sim::StreamId stream, int peer, double bytes, bool is_send);

  sim::Cluster cluster_;
  sim::ClusterSpec spec_;
  sim::CostConstants constants_;
  sim::CostModel cost_;
  SimOptions options_;
  std::unique_ptr<sim::Executor> executor_;
  std::vector<SimJob> jobs_;
  std::vector<std::pair<int, int>> rank_of_gpu_;  // by GPU: (job, rank), or (-1, -1)
  // By job, by rank: its pipeline stage (SimJob::stages), -1 if not simulated; empty without stages.
  std::vector<std::vector<int>> stage_of_rank_;
  std::map<std::pair<int, int>, std::size_t> rep_index_;  // (job, rank) -> backends_
  std::vector<std::unique_ptr<SimBackend>> backends_;
  // Executor collectives by (job, group id) in issue order, and how many
  // each member has joined: the k-th call on a group is the k-th collective.
  std::map<std::pair<int, int>, std::vector<sim::CollectiveId>> group_collectives_;
  std::map<std::tuple<int, int, int>, std::size_t> joined_;  // (job, group, rank)
  // (kind, bytes, members, experts, top_k) -> analytic time.
  std::map<std::tuple<int, double, std::vector<int>, int, int>, sim::Time> analytic_cache_;
  sim::StepCosts step_costs_;  // of the analytic collectives, shared by their sizes
  std::map<std::tuple<int, int, int>, sim::StreamId> send_streams_;  // by (job, rank, peer)
  std::uint64_t sends_ = 0;
  std::array<SimCollectiveStats, sim::kNumCollectiveKinds> analytic_stats_{};
  std::optional<Error> error_;
  bool ran_ = false;
};

}  // namespace meshtrain
