// The planner's fast tier: an iteration time for every candidate that fits,
// from a few cached discrete-event simulations and closed forms.
//
// Cached DES. What a micro-batch costs inside a pipeline stage depends only
// on (tp, sequence parallelism, micro-batch, recomputation and its modules,
// ep, etp, cp, cp_comm, EP all-to-all overlap; FastEstimator::Key): the GEMMs, attention, memory-bound kernels, tensor-parallel
// collectives, expert all-to-alls and the context-parallel key/value
// all-gathers or ring exchanges. For each such key the sim backend runs the
// model on one pipeline stage (pp 1, dp = ep, ZeRO 0, tp·cp ranks: a
// context group sits tp apart in the reference as in the plan). When every body layer is alike
// (a decoder whose layers are all dense or all MoE) it runs the model cut to
// L = 1 and 2 layers with k = 1 and 2 micro-batches, and
//   T(L, k) = a + b·L + c·k + d·L·k
// gives a layer's forward and backward per micro-batch (d), the embedding and
// head's (c), a layer's per-iteration work (b: its optimizer step) and the
// rest's (a): four small simulations instead of one of the whole model.
// Otherwise (vision models, MoE layer patterns) it runs the whole model with
// k = 1 and 2 and splits the per-micro-batch time over the blocks by their
// forward FLOPs weighted by what recomputation runs again (full: 4/3 on body
// layers; selective: the attention core once more), the per-iteration time
// by their parameters.
//
// Closed forms (p stages, v chunks, m micro-batches per pipeline; a block's
// forward is 1/3 of its forward and backward, 1/4 with full recomputation):
//   collectives: each kind the plan's data-parallel group (dp ranks tp
//     apart) and pipeline neighbours (tp·dp apart) issue is timed once on
//     the cluster's topology by the simulator's own analytic collective
//     model (sim::analytic_time, the algorithm its tuner picks, links at the
//     share of line rate the sim backend uses) at two sizes, giving
//     t(bytes) = latency + bytes·per_byte for that group
//   t_hop: one pipeline send of mb·seq·hidden elements at the plan's
//     precision; in the steady state a stage's send overlaps its neighbour's
//     compute (the DES shows it), so only the fill and drain wait for them
//   ZeRO 2, 3: a block's backward takes at least its gradients'
//     reduce-scatter (every micro-batch), and under ZeRO 3 its gather too;
//     its forward at least its gather; without prefetch_across_chunks each
//     chunk's forward and backward pass also waits for its first block's
//     gather (prefetch stays within a pass)
//   stage time t_s: the sum over its blocks; t_max, t_mean over the stages
//   pipeline = m·t_max + (p-1)·(t_mean/v + 2·t_hop) + the stages' most
//     once-an-iteration time (Reference::once_s: EP all-to-all overlap's
//     unpaired first forward and last backward)
//     (engine/schedule/timing.h: (m·v + p - 1)·(f + b) on uniform stages;
//     the slowest stage paces the steady state)
//   optimizer = the most loaded stage's per-iteration work, under ZeRO >= 1
//     the share a rank owns (dense parameters / dp·cp, experts / their
//     expert-data group)
//   data parallel: an all-reduce of the stage's gradients (ZeRO 0; grad_dtype) in
//     buckets, or a reduce-scatter of them and an all-gather of the updated
//     parameters bucket by bucket (ZeRO 1, 2), over the dp·cp ranks holding
//     the same parameters (tp apart), routed experts' over their expert-data
//     group (etp·ep apart), each part in buckets of its own; exposed in full after
//     backward (grad_sync after-backward, and the all-gather of updated
//     parameters), otherwise beyond the last micro-batch's backward (at
//     least one bucket's share). zero_reduce_once: ZeRO 2/3 reduce-scatter
//     the whole stage once, after the last micro-batch, as ZeRO 1
//   gradient compression: the wire bytes of every gradient reduction scaled
//     (bf16, fp16: 2 bytes an element; 1bit: a bit and a 4-byte scale per
//     256, by all-to-all, then all-gather under ZeRO 0), plus the cast or
//     sign kernels as memory-bound kernels over the gradients
//   offload: the optimizer step becomes the bucket-pipelined host AdamW
//     (CostModel::host_adamw, the node's ranks sharing its CPUs) with the
//     gradients' copy down and the fp32 master's copy up over PCIe (the
//     slowest of the three, plus the others' share of one bucket); under
//     `params` each ZeRO 3 gather also first copies its fp32 shard up
//   overlap_update: each bucket's update (and all-gather) follows its
//     reduction on the data-parallel stream: the optimizer and
//     data-parallel work together are exposed beyond the last micro-batch's
//     backward (at least one bucket's share)
//   iteration = pipeline + optimizer + exposed data-parallel time
//
// Its job is to rank: the full tier re-times the best candidates with the
// DES, and RESULTS.md reports how well this order and these times agree.
#pragma once

#include <map>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/planner/memory_fit.h"
#include "engine/planner/search_space.h"
#include "engine/simulation/simulation.h"
#include "simulator/collective.h"
#include "simulator/cost_model.h"
#include "simulator/topology.h"

namespace meshtrain::planner {

// The fast tier's terms (closed forms above); --json prints them per candidate.
struct FastBreakdown {
  double iteration_s = 0;
  double pipeline_s = 0;  // the whole pipeline, its bubble and exposed transfers included
  // Of which the fill's and drain's compute, and their hops through every virtual stage (a stage's
  // receives within each micro-batch, without overlap_p2p_comm, are in the micro-batches' time).
  double bubble_s = 0, p2p_s = 0;
  double optimizer_s = 0, data_parallel_s = 0;
};

class FastEstimator {
 public:
  // `options` is what the full tier simulates with (cluster, calibration,
  // software stack); it must outlive the estimator.
  FastEstimator(const SearchContext& ctx, const SimulateOptions& options);

  // Runs the reference simulations the plans need that are not cached yet, on all cores.
  Status prepare(const std::vector<const Plan*>& plans);
  // Needs prepare() for the plan's key; `fit` is the plan's memory_fit.
  FastBreakdown estimate(const Plan& p, const MemoryFit& fit) const;
  std::size_t reference_simulations() const;

  // The ranks holding the same parameters (engine/plan/mesh.h): the dp·cp
  // ranks tp apart, and for routed experts the expert-data group, etp·ep apart.
  struct Replicas {
    int members = 1, stride = 1;
  };
  static Replicas replicas_of(const Plan& p, bool experts);
  // Pipeline hops a stage's micro-batch waits for on its compute stream (its receives), and the fill's
  // and drain's hops (both tiers: the uniform one and PlanEstimator's segments).
  static double receive_hops(const Plan& p, int stage);
  static double fill_drain_hops(const Plan& p);

 private:
  // Segment layouts reuse the references and collective fits (plan_estimate.h).
  friend class PlanEstimator;
  // What one micro-batch costs inside a stage depends on (the reference simulations' cache key).
  struct Key {
    int tp = 1;
    bool sp = false;
    int micro_batch = 1;
    Recompute recompute = Recompute::none;
    bool recompute_layernorm = false, recompute_moe_act = false;  // Plan::recompute_modules
    int ep = 1, etp = 0, cp = 1;
    ContextComm cp_comm = ContextComm::all_gather;  // all_gather whenever cp is 1: one reference
    bool a2a_overlap = false;                       // Plan::moe_a2a_overlap: pairs change a micro-batch's cost
    auto operator<=>(const Key&) const = default;
    // `base` as the one-stage reference at this key: pp 1, ZeRO 0, dp = ep.
    Plan reference_plan(Plan base) const;
    // The tp 1 key a segment layout scales from where the whole model refuses this tp (plan_estimate.h).
    Key without_tp() const {
      Key k = *this;
      k.tp = 1, k.sp = false;
      return k;
    }
  };
  struct Reference {
    std::vector<double> microbatch_s;  // per block (embedding, layers, head): forward and backward of one micro-batch
    std::vector<double> step_s;        // per block: per-iteration work (the optimizer's)
    // Per block: per-iteration time that is not the optimizer's. EP all-to-all overlap runs the first
    // forward and the last backward unpaired: once an iteration, what a pair saves (the reference
    // without the overlap's per-micro-batch term less the overlapped one's). Empty: none.
    std::vector<double> once_s;
  };
  static Key key_of(const Plan& p);
  // Simulates the references `keys` name that are not cached yet, on all cores, and caches them
  // (with an overlapped key, the same key without the overlap too); `what` names them in an error.
  Status add_references(std::vector<Key> keys, std::string_view what);
  // One key's one-stage simulations, as they come (no once_s).
  Result<Reference> simulate_one_stage(const Key& k) const;

  struct CollectiveFit {
    double latency = 0, per_byte = 0;  // seconds, seconds per byte (nccl-tests' size)
  };
  using CollectiveKey = std::tuple<int, int, int>;  // kind, members, stride between them
  Status fit_collective(const CollectiveKey& key);
  double collective_s(sim::CollectiveKind kind, int members, int stride, double bytes) const;
  // A copy between host and device of `bytes` (the sim backend's rate: PCIe shared by a switch's GPUs).
  double pcie_s(double bytes) const;

  // estimate()'s terms. The plan's gradient collectives over `g`, with its
  // compression's kernels: a reduce-scatter or an all-reduce of `elements`
  // gradients (grad_dtype); a gather of `params` parameters, `fp8_share` of them FP8 linears' weights
  // (one byte each under fp8_param_gather).
  double reduce_scatter_s(const Plan& p, double elements, Replicas g) const;
  double all_reduce_s(const Plan& p, double elements, Replicas g) const;
  double gather_s(const Plan& p, double params, double fp8_share, Replicas g) const;
  // Under ZeRO 3 in fp8, one micro-batch's casts of block i's gathered FP8 weights on this rank.
  double zero3_weight_casts_s(const Plan& p, std::size_t i) const;
  // The share of FP8 linears' weights (is_fp8_linear) among block i's dense (experts false) or routed
  // experts' parameters; block -1: among the whole model's.
  double fp8_share(std::ptrdiff_t block, bool experts) const;
  // The share of a block's parameters a rank holds (ZeRO and tp sharding), from the memory fit's peak stage.
  double shard(const Plan& p, const MemoryFit& fit, const std::vector<LayerRange>& ranges) const;
  // Block i's forward and backward of one micro-batch, stretched by ZeRO 2/3's communication.
  double block_s(const Plan& p, const Reference& ref, std::size_t i, double shard) const;
  struct StageTimes {
    std::vector<double> microbatch_s;  // per pipeline stage: one micro-batch's forward and backward
    std::vector<double> step_s;        // per pipeline stage: per-iteration work (the optimizer's)
    std::vector<double> once_s;        // per pipeline stage: Reference::once_s
  };
  StageTimes stage_times(const Plan& p, const MemoryFit& fit, const Reference& ref) const;
  // pipeline_s, bubble_s and p2p_s of `b`.
  void add_pipeline(const Plan& p, const StageTimes& stages, FastBreakdown& b) const;
  // The optimizer step of the most loaded rank, before any overlap: `owned` of its stage's `params` (ZeRO
  // shards dense parameters over dp·cp, experts over their expert-data group).
  double optimizer_s(const Plan& p, double params, double owned, double buckets,
                     const std::vector<double>& stage_step_s) const;
  // optimizer_s and data_parallel_s of `b`.
  void add_update(const Plan& p, const MemoryFit& fit, const StageTimes& stages, FastBreakdown& b) const;

  const SearchContext& ctx_;
  const SimulateOptions& options_;
  sim::CostModel cost_;  // the device's memory-bound kernels and the host's AdamW, as the sim backend times them
  std::vector<double> forward_flops_;    // per block, one sample
  std::vector<double> attention_flops_;  // per block, one sample
  std::vector<double> parameters_;       // per block, unsharded
  std::vector<double> expert_parameters_;  // per block, unsharded: of which routed experts' (ParamInfo::expert)
  std::vector<double> fp8_parameters_;         // per block: of which FP8 linears' weights (is_fp8_linear)
  std::vector<double> fp8_expert_parameters_;  // per block: of those, the routed experts'
  bool layers_alike_ = false;
  std::map<Key, Reference> refs_;  // filled by prepare() only
  std::optional<sim::Cluster> cluster_;  // ctx.gpus GPUs of the cluster, as the sim backend builds it
  std::map<CollectiveKey, CollectiveFit> collectives_;  // filled by prepare() only
};

}  // namespace meshtrain::planner
