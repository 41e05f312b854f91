// The sim backend: shape-only tensors, every op recorded as a task on the
// discrete-event simulator (simulator/executor.h) and timed there. The
// cluster it runs on, the representative ranks that drive it and why they
// suffice: sim_cluster.h.
//
// How each op becomes a task:
//  * gemm / batched_gemm: CostModel::gemm(m, n, k, batch); attention:
//    CostModel::attention(B·H, T, D, causal, backward), or the kernels of
//    unfused attention (AttentionImpl), plus a memory-bound
//    "attention_score_terms" task for the bytes of a bias and mask read per
//    batch entry (and the score gradient summed into dbias); every other compute
//    op is memory-bound on the bytes it reads and writes
//    (CostModel::memory_bound with the op's cost name, so a calibration can
//    time each op kind on its own). Dimensions, FLOPs and bytes are the op
//    table's (backends/op_table.h), not formulas of this backend.
//  * A collective whose members are all representatives is one executor
//    collective they all join (the k-th call on a group by each member is the
//    same collective). One whose other members are not simulated is a task
//    of the analytic duration on the issuing stream; with two or more (but
//    not all) members simulated, those first meet in a zero-byte executor
//    collective (they really wait for each other) and then run that task.
//    Byte counts are nccl-tests sizes: all-reduce and broadcast the buffer,
//    reduce-scatter its input, all-gather its output, all-to-all the larger of
//    what the rank sends and receives (the send buffer when even).
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
// reset_peak; host memory (host_zeros) is counted apart.
//
// Offload: a copy with a side on the host is a task of SimCluster::host_copy
// (PCIe) on the current stream and a foreach_adamw on host tensors one of
// CostModel::host_adamw (the host's CPUs); neither counts as compute.
//
// Implemented by concept: sim_ops.cc (op timing), sim_communication.cc
// (collectives and send/recv), sim_memory.cc (storage and memory
// accounting), sim_backend.cc (streams and events), sim_cluster.cc (the
// cluster and the report of its run).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/sim_cluster.h"
#include "simulator/collective.h"
#include "simulator/executor.h"

namespace meshtrain {

struct OpInfo;  // backends/op_table.h
struct OpArgs;

class SimBackend final : public Backend {
 public:
  // Rank `rank` of job `job` (SimCluster's "Jobs"), placed on GPU `device`.
  SimBackend(SimCluster& cluster, int job, int rank, int world_size, int device);
  ~SimBackend() override;

  std::string_view name() const override { return "sim"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  bool holds_values() const override { return false; }
  int job() const { return job_; }
  int device() const { return device_; }

  #include "backends/runtime_overrides.inc"
  Tensor zeros(const Shape& shape, DType dtype = DType::f32) override;  // empty: there is no data
  bool on_host(const Tensor& t) const;
  void init_normal(Tensor& x, const NormalInitOp& op) override;  // like write: no data, no time
  Stream current_stream() const override { return current_; }

  #include "backends/kernel_overrides.inc"

  // One task for all groups (CostModel::grouped_gemm, or _wgrad when op.trans_a).
  void grouped_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                    const GemmOp& op) override;

  void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) override;

  #include "backends/collective_overrides.inc"
  // FP8 elements at one byte on the wire, the rest at their dtype's (fp8_wire.h).
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override;
  void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                      std::span<const std::int64_t> recv_counts, const Group& g) override;

  double compute_seconds() const;  // sum of issued compute durations
  // The part of compute_seconds() issued on the default stream (the first
  // created): what that stream's busy time would be without communication.
  double compute_stream_seconds() const;
  const SimHostWork& host_work() const { return host_work_; }
  // FP8 GEMMs (a plan with precision fp8, Transformer Engine's recipe): from
  // now on every gemm and grouped_gemm on 16-bit operands costs as
  // sim::DType::kFp8, except those with a dimension of `bf16_width` (the
  // output layer's vocabulary shard, kept in bf16 as Megatron's output layer
  // is not a Transformer Engine module); batched_gemm and attention stay bf16.
  // The backward GEMMs (an operand transposed) cost as kFp8Split (gemm_dtype).
  void use_fp8_gemms(std::int64_t bf16_width) {
    fp8_gemms_ = true;
    fp8_exempt_width_ = bf16_width;
  }
  // A dispatcher that sends each token once per destination node and GPU
  // (DeepEP, HybridEP): from now on the all-to-alls of activations on group
  // `group_id` (the expert group) are a mixture-of-experts layer's token rows,
  // each a slot of one of `experts` experts, top_k per token, and cost as
  // sim::Algorithm::kDeduplicated. The layer's other exchange on that group,
  // its i32 row counts, stays a plain all-to-all (models/moe_layer.h).
  void use_expert_dispatch(int group_id, int experts, int top_k) {
    expert_group_ = group_id;
    experts_ = experts;
    top_k_ = top_k;
  }
  // Forgets the host work issued so far (a simulation's set-up: the offloaded master's first copy).
  void reset_host_work() { host_work_ = {}; }
  std::string set_region(std::string name) override;
  // Per region (Backend::set_region; "" outside any): issued compute seconds and bytes this rank sent.
  struct Region {
    double compute_s = 0, sent_bytes = 0;
  };
  const std::map<std::string, Region>& regions() const { return regions_; }

  struct Accounting;  // shared with every storage this backend allocated

 private:
  // A compute task of `duration` on the current stream.
  void compute(sim::NameId name, sim::Time duration);
  // A task of `duration` on the current stream that is not device compute (PCIe, the host's CPUs).
  void off_device(sim::NameId name, sim::Time duration);
  // A memory-bound task of op `op` on `tensors` (in its table entry's order), moving the bytes
  // backends/op_table.h counts for them, under the op's cost name.
  void charge(const OpInfo& op, std::initializer_list<const Tensor*> tensors);
  void charge(const OpInfo& op, const OpArgs& args);
  // check() each of `checked` (by default every tensor), then charge op `op` on `tensors`.
  void checked_charge(const char* op, std::initializer_list<const Tensor*> tensors);
  void checked_charge(const char* op, std::initializer_list<const Tensor*> checked,
                      std::initializer_list<const Tensor*> tensors);
  // A fused attention task of `info`'s work on `tensors` at `dtype`.
  void fused_attention(const OpInfo& info, const OpArgs& args, DType dtype);
  // The memory-bound part of an attention with a bias or mask (AttentionOp).
  void score_terms(const Tensor& qkv, const AttentionOp& op, bool backward);
  // The kernels of AttentionImpl::unfused over `bh` (batch·heads) sequences
  // of `seq` keys, for `rows` query rows (AttentionOp's query window).
  void unfused_attention(std::int64_t bh, std::int64_t seq, std::int64_t rows, std::int64_t head_dim,
                         DType dtype, bool backward);
  // CrossEntropyImpl::unfused: one memory-bound kernel per (name, bytes per logit) pass over `logits`.
  bool unfused_cross_entropy(const Tensor& logits, std::initializer_list<std::pair<const char*, double>> passes);
  void check(const Tensor& t, const char* op) const;
  void check_all(const char* op, std::initializer_list<const Tensor*> tensors) const;
  sim::StreamId executor_stream(Stream s) const;
  sim::DType compute_dtype(DType t) const;
  // compute_dtype, or for an (m, n, k) GEMM that use_fp8_gemms covers kFp8, and kFp8Split where `op`
  // transposes an operand: the engine issues a linear's forward as x·W and its backward GEMMs as
  // dy·Wᵀ (dgrad) and xᵀ·dy (wgrad), which Transformer Engine runs with the split accumulator.
  sim::DType gemm_dtype(DType t, std::int64_t m, std::int64_t n, std::int64_t k, const GemmOp& op) const;
  sim::NameId op_name(std::string_view name);  // interned once per distinct name
  void collective(sim::CollectiveKind kind, double bytes, const Group& g, int root = 0);
  void collective(const Group& g, sim::CollectiveRequest request);
  // all_gather and all_to_all of `element` bytes an element (the tensor's, or one under FP8).
  void gather(const Tensor& in, Tensor& out, const Group& g, double element);
  void exchange(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                std::span<const std::int64_t> recv_counts, const Group& g, double element);

  SimCluster& cluster_;
  int job_, rank_, world_size_, device_;
  std::shared_ptr<Accounting> accounting_;
  std::vector<sim::StreamId> streams_;  // by Stream::id
  Stream current_{};
  std::vector<sim::NameId> events_;  // by Event::id
  sim::Time compute_ = 0, compute_stream_ = 0;
  SimHostWork host_work_;
  std::string region_;
  bool fp8_gemms_ = false;
  int expert_group_ = -1, experts_ = 0, top_k_ = 0;  // use_expert_dispatch
  std::int64_t fp8_exempt_width_ = 0;
  std::map<std::string, Region> regions_;
  Region* current_region_ = nullptr;  // regions_[region_], once looked up (map nodes stay put)
  Region& region() {
    if (current_region_ == nullptr) current_region_ = &regions_[region_];
    return *current_region_;
  }
};

}  // namespace meshtrain
