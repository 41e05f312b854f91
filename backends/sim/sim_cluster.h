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
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "simulator/calibration.h"
#include "simulator/cluster_spec.h"
#include "simulator/collective.h"
#include "simulator/cost_model.h"
#include "simulator/executor.h"
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

struct SimOptions {
  bool trace = false;  // collect a Chrome trace (SimCluster::trace())
  AttentionImpl attention = AttentionImpl::flash;
  // With AttentionImpl::unfused: the dropout probability on the attention
  // probabilities (0: no dropout kernel). Flash attention fuses it.
  float attention_dropout = 0.f;
  // How collectives among representatives are timed (flows see contention).
  sim::CollectiveMode mode = sim::CollectiveMode::kFlows;
  const sim::Calibration* calibration = nullptr;  // may be null; must outlive the cluster
};

// Per representative rank, after run().
struct SimRankReport {
  int rank = 0;
  std::int64_t peak_bytes = 0;
  double compute_s = 0;       // sum of issued compute durations (full speed)
  double compute_busy_s = 0;  // busy time of the default stream (compute + comm issued on it)
  double idle_s = 0;          // iteration time minus that busy time
  std::uint64_t tasks = 0;
  // Per region (Backend::set_region): issued compute seconds and bytes sent.
  std::map<std::string, std::pair<double, double>> regions;
};

struct SimCollectiveStats {
  double time_s = 0;  // summed durations, each collective counted once
  std::uint64_t count = 0;
  double bytes = 0;  // summed nccl-tests sizes
};

struct SimReport {
  double iteration_s = 0;            // makespan of everything issued
  std::vector<SimRankReport> ranks;  // in the order of SimCluster::representatives()
  std::array<SimCollectiveStats, sim::kNumCollectiveKinds> collectives{};
  std::uint64_t tasks = 0;  // tasks recorded on the executor, all streams
  std::uint64_t events = 0;
};

class SimCluster {
 public:
  // A cluster of `world_size` GPUs of `spec`; rank r is GPU r. Only
  // `representatives` (distinct global ranks) get a backend.
  static Result<std::unique_ptr<SimCluster>> create(const sim::ClusterSpec& spec, int world_size,
                                                    std::vector<int> representatives,
                                                    SimOptions options = {});
  ~SimCluster();

  const std::vector<int>& representatives() const { return reps_; }
  SimBackend& backend(int global_rank);  // aborts for a rank that is not a representative
  const sim::Cluster& cluster() const { return cluster_; }
  const sim::CostModel& cost_model() const { return cost_; }

  // Times everything issued so far. Single use, like the executor.
  Result<SimReport> run();
  const sim::Trace& trace() const { return executor_->trace(); }

 private:
  friend class SimBackend;
  SimCluster(sim::Cluster cluster, const sim::ClusterSpec& spec, std::vector<int> reps,
             SimOptions options);

  bool simulated(int rank) const { return rep_index_.count(rank) != 0; }
  void fail(Error e);
  // The analytic duration of `request` (cached by kind, bytes and members).
  Result<sim::Time> analytic(const sim::CollectiveRequest& request);
  // Issues collective `request` over `group` from `rank` on executor stream `stream`.
  void collective(int rank, sim::StreamId stream, const Group& group,
                  sim::CollectiveRequest request);
  void point_to_point(int rank, sim::StreamId stream, int peer, double bytes, bool is_send);

  sim::Cluster cluster_;
  sim::CostConstants constants_;
  sim::CostModel cost_;
  SimOptions options_;
  std::unique_ptr<sim::Executor> executor_;
  std::vector<int> reps_;
  std::map<int, std::size_t> rep_index_;
  std::vector<std::unique_ptr<SimBackend>> backends_;
  // Executor collectives by group id in issue order, and how many each
  // member has joined: the k-th call on a group is the k-th collective.
  std::map<int, std::vector<sim::CollectiveId>> group_collectives_;
  std::map<std::pair<int, int>, std::size_t> joined_;
  std::map<std::tuple<int, double, std::vector<int>>, sim::Time> analytic_cache_;
  std::map<std::pair<int, int>, sim::StreamId> send_streams_;  // by (rank, peer)
  std::uint64_t sends_ = 0;
  std::array<SimCollectiveStats, sim::kNumCollectiveKinds> analytic_stats_{};
  std::optional<Error> error_;
  bool ran_ = false;
};

}  // namespace meshtrain
