// The sim backend: shape-only tensors, every op recorded as a task on the
// discrete-event simulator (simulator/executor.h) and timed there.
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
// How each op becomes a task:
//  * gemm / batched_gemm: CostModel::gemm(m, n, k, batch); attention:
//    CostModel::attention(B·H, T, D, causal, backward), or the kernels of
//    unfused attention (AttentionImpl); every other compute
//    op is memory-bound on the bytes it reads and writes
//    (CostModel::memory_bound with the op name, so a calibration can time
//    each op kind on its own).
//  * A collective whose members are all representatives is one executor
//    collective they all join (the k-th call on a group by each member is the
//    same collective). One whose other members are not simulated is a task
//    of the analytic duration on the issuing stream; with two or more (but
//    not all) members simulated, those first meet in a zero-byte executor
//    collective (they really wait for each other) and then run that task.
//    Byte counts are nccl-tests sizes: all-reduce and broadcast the buffer,
//    reduce-scatter its input, all-gather its output, all-to-all the send buffer.
//  * send/recv between representatives are executor send/recv (flows). A
//    send runs on a per-peer stream that waits for the issuing stream's work
//    so far (a buffered send: the issuer goes on); a recv blocks its stream.
//    With a peer that is not simulated, the analytic send/recv time on the issuer.
//  * streams are executor streams named after the backend's streams; record
//    and wait map to executor events (one per Event, so a wait waits for that
//    record and not a later one on the same stream).
// Analytic communication tasks run as executor compute tasks, so they do not
// slow concurrent compute the way executor communication does
// (CostConstants::comm_compute_slowdown); SimReport accounts them as
// communication.
//
// Memory: live bytes are numel · dtype size of live storage, freed when the
// last handle goes (issue order, as the cpu backend counts), peak since
// reset_peak.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
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

class SimBackend final : public Backend {
 public:
  SimBackend(SimCluster& cluster, int rank, int world_size);
  ~SimBackend() override;

  std::string_view name() const override { return "sim"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Tensor empty(const Shape& shape, DType dtype = DType::f32) override;
  Tensor zeros(const Shape& shape, DType dtype = DType::f32) override;  // empty: there is no data
  MemoryStats memory_stats() const override;
  void reset_peak() override;

  void write(Tensor& dst, std::span<const float> host) override;
  void write(Tensor& dst, std::span<const std::int32_t> host) override;
  void init_normal(Tensor& x, const NormalInitOp& op) override;  // like write: no data, no time
  Status read(const Tensor& src, std::span<float> host) override;

  Stream create_stream(std::string_view name) override;
  void set_stream(Stream s) override;
  Stream current_stream() const override { return current_; }
  Event record(Stream s) override;
  void wait(Stream s, Event e) override;
  Status synchronize() override;

  void fill(Tensor& x, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(Tensor& x, float alpha) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void sum(const Tensor& x, Tensor& out, float scale, bool accumulate) override;
  void sum_squares(const Tensor& x, Tensor& out, bool accumulate) override;

  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;

  void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                         std::int64_t vocab_offset) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                          std::int64_t vocab_offset) override;

  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                         Tensor& mean, Tensor& rstd, float eps) override;
  void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                       float eps) override;
  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight) override;

  void gelu_forward(const Tensor& x, Tensor& out) override;
  void gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override;
  void swiglu_forward(const Tensor& x, Tensor& out) override;
  void swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override;
  void dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) override;
  void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) override;

  void rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse) override;
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                         const AttentionOp& op) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, Tensor& dqkv, const AttentionOp& op) override;

  void cross_entropy_max(const Tensor& logits, Tensor& row_max) override;
  void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              std::int64_t vocab_offset, Tensor& sumexp,
                              Tensor& target_logit) override;
  void cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp, const Tensor& target_logit,
                          Tensor& losses) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              const Tensor& sumexp, std::int64_t vocab_offset, float dloss,
                              Tensor& dlogits) override;

  void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) override;
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
             const AdamWOp& op) override;
  // One op under the per-tensor op's name, timed by the bytes of all its tensors.
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) override;
  void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                     const AdamWOp& op) override;

  void all_reduce(Tensor& x, const Group& g, ReduceOp op) override;
  void reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out, const Group& g) override;
  void broadcast(Tensor& x, const Group& g, int root_global_rank) override;
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                  std::span<const std::int64_t> recv_counts, const Group& g) override;
  void send(const Tensor& x, int peer_global_rank, int tag) override;
  void recv(Tensor& x, int peer_global_rank, int tag) override;
  void barrier(const Group& g) override;

  double compute_seconds() const;  // sum of issued compute durations

  struct Accounting;  // shared with every storage this backend allocated

 private:
  // A compute task of `duration` on the current stream.
  void compute(sim::NameId name, sim::Time duration);
  // A memory-bound task moving the bytes of `tensors` (each read or written once).
  void memory_op(sim::NameId name, std::initializer_list<const Tensor*> tensors);
  // The kernels of AttentionImpl::unfused over `bh` (batch·heads) sequences.
  void unfused_attention(std::int64_t bh, std::int64_t seq, std::int64_t head_dim, DType dtype,
                         bool backward);
  void check(const Tensor& t, const char* op) const;
  sim::StreamId executor_stream(Stream s) const;
  sim::DType compute_dtype(DType t) const;
  sim::NameId op_name(std::string_view name);  // interned once per distinct name
  void collective(sim::CollectiveKind kind, double bytes, const Group& g, int root = 0);

  SimCluster& cluster_;
  int rank_, world_size_;
  std::shared_ptr<Accounting> accounting_;
  std::vector<sim::StreamId> streams_;  // by Stream::id
  Stream current_{};
  std::vector<sim::NameId> events_;  // by Event::id
  sim::Time compute_ = 0;
};

}  // namespace meshtrain
