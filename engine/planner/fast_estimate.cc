#include "engine/planner/fast_estimate.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "models/block.h"
#include "models/model_io.h"
#include "models/parameters.h"
#include "simulator/constants.h"

namespace meshtrain::planner {

namespace {

// The cluster as the sim backend builds it (backends/sim/sim_cluster.cc):
// links at the share of their line rate that collectives reach, except those
// a calibration measured.
sim::ClusterSpec effective_spec(const SimulateOptions& o) {
  const sim::CostConstants constants;
  auto measured = [&](std::string_view kind) {
    if (o.calibration == nullptr) return false;
    for (const auto& l : o.calibration->links)
      if (l.kind == kind) return true;
    return false;
  };
  sim::ClusterSpec s = o.cluster;
  if (!measured("nvlink")) s.nvlink_bandwidth *= constants.nvlink_efficiency;
  if (!measured("nic")) s.nic_bandwidth *= constants.network_efficiency;
  return s;
}

// Bytes a gradient element takes on the wire (grad_compression.h): the
// plan's gradient dtype, 16 bits, or 1bit's sign and a 4-byte scale per
// kSignChunk elements.
double wire_bytes(const Plan& p, GradCompression c) {
  switch (c) {
    case GradCompression::none: return gradient_bytes(p);
    case GradCompression::bf16:
    case GradCompression::fp16: return 2;
    case GradCompression::one_bit: return 1.0 / 8 + 4.0 / 256;
  }
  return 4;
}

// Bytes the compression's kernels stream per gradient element: bf16 casts
// down and back (4+2, 2+4); fp16 also divides by the group before and
// multiplies after (4+4 each); 1bit adds the worker error (4+4+4), takes
// signs and scales (4+..), decompresses and sums its block's copies (4+4),
// and keeps the new error (4+4).
double compression_kernel_bytes(GradCompression c) {
  switch (c) {
    case GradCompression::none: return 0;
    case GradCompression::bf16: return 12;
    case GradCompression::fp16: return 28;
    case GradCompression::one_bit: return 32;
  }
  return 0;
}

}  // namespace

FastEstimator::FastEstimator(const SearchContext& ctx, const SimulateOptions& options)
    : ctx_(ctx), options_(options), cost_(options.cluster.device, sim::CostConstants{}, options.calibration) {
  const ModelBlocks blocks = model_blocks(ctx.model);
  const std::int64_t seq = ctx.base.effective_seq_len(ctx.model);
  for (const auto& b : blocks) {
    const ForwardFlops f = b->flops(1, seq);
    forward_flops_.push_back(f.total());
    attention_flops_.push_back(f.attention);
    double n = 0, experts = 0, fp8 = 0, fp8_experts = 0;
    for (const ParamInfo& info : b->parameters()) {
      const double k = static_cast<double>(info.numel());
      n += k;
      if (info.expert) experts += k;
      if (is_fp8_linear(info)) fp8 += k, fp8_experts += info.expert ? k : 0;
    }
    parameters_.push_back(n);
    expert_parameters_.push_back(experts);
    fp8_parameters_.push_back(fp8);
    fp8_expert_parameters_.push_back(fp8_experts);
  }
  const ModelSpec& m = ctx.model;
  if (auto c = sim::Cluster::build(effective_spec(options), ctx.gpus)) cluster_.emplace(std::move(c).value());
  layers_alike_ = model_io(m).layers_alike;
}

FastEstimator::Key FastEstimator::key_of(const Plan& p) {
  return {p.tp,
          p.sequence_parallel,
          p.micro_batch,
          p.recompute,
          p.recompute_modules.layernorm,
          p.recompute_modules.moe_act,
          p.ep,
          p.etp,
          p.cp,
          p.cp > 1 ? p.cp_comm : ContextComm::all_gather,
          p.moe_a2a_overlap};
}

Plan FastEstimator::Key::reference_plan(Plan p) const {
  p.tp = tp, p.sequence_parallel = sp, p.micro_batch = micro_batch, p.recompute = recompute;
  p.recompute_modules = {recompute_layernorm, recompute_moe_act};
  p.ep = ep, p.etp = etp, p.cp = cp, p.cp_comm = cp_comm, p.moe_a2a_overlap = a2a_overlap;
  p.pp = 1, p.vpp = 1, p.zero = 0, p.dp = p.ep;
  return p;
}

Status FastEstimator::add_references(std::vector<Key> keys, std::string_view what) {
  // EP all-to-all overlap: m micro-batches run F0, m-1 pairs and the last backward, so m pairs' time
  // and, once an iteration, what a pair saves (the first forward and the last backward run unpaired).
  // The overlapped simulation's per-micro-batch term is a pair; the same key without the overlap
  // (simulated first, and cached as a reference of its own) gives the unpaired passes and the optimizer
  // step, which the two-layer fit's per-iteration term measures less well.
  for (std::size_t i = 0, n = keys.size(); i < n; ++i)
    if (keys[i].a2a_overlap) {
      Key plain = keys[i];
      plain.a2a_overlap = false;
      keys.push_back(plain);
    }
  for (bool overlap : {false, true}) {
    std::vector<Key> todo;
    for (const Key& k : keys)
      if (k.a2a_overlap == overlap && !refs_.count(k)) todo.push_back(k);
    std::sort(todo.begin(), todo.end());
    todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    std::vector<std::optional<Result<Reference>>> out(todo.size());
    tbb::parallel_for(std::size_t{0}, todo.size(), [&](std::size_t i) { out[i] = simulate_one_stage(todo[i]); });
    for (std::size_t i = 0; i < todo.size(); ++i) {
      const Key& k = todo[i];
      if (!*out[i])
        return std::move(*out[i]).error().context(fmt::format(
            "fast tier: simulating {} with tp {} sp {} micro-batch {} recompute {} ep {} cp {}{}", what, k.tp, k.sp,
            k.micro_batch, recompute_name(k.recompute), k.ep, k.cp, k.a2a_overlap ? " a2a-overlap" : ""));
      Reference ref = std::move(*out[i]).value();
      if (overlap) {
        Key plain_key = k;
        plain_key.a2a_overlap = false;
        const Reference& plain = refs_.at(plain_key);
        ref.once_s.assign(ref.step_s.size(), 0.0);
        for (std::size_t b = 0; b < ref.step_s.size(); ++b) {
          ref.once_s[b] = std::max(0.0, plain.microbatch_s[b] - ref.microbatch_s[b]);
          ref.step_s[b] = plain.step_s[b];
        }
      }
      refs_[k] = std::move(ref);
    }
  }
  return {};
}

Result<FastEstimator::Reference> FastEstimator::simulate_one_stage(const Key& k) const {
  Plan p = k.reference_plan(ctx_.base);
  // The optimizer on the device's critical path, gradients as they are: the closed forms add the plan's own.
  p.overlap_update = false, p.offload = Offload::none, p.grad_compression = GradCompression::none;
  p.zero_reduce_once = false;
  p.schedule = ScheduleKind::one_f_one_b;
  p.first_stage_layers = p.last_stage_layers = 0;
  SimulateOptions o = options_;
  o.check_memory = false;  // memory is judged by the memory model, for the real plan
  o.trace = false;
  auto time = [&](const ModelSpec& m, int microbatches) -> Result<double> {
    p.global_batch = p.micro_batch * p.dp * microbatches;
    MT_ASSIGN(SimulationResult r, simulate_iteration(m, p, o));
    return r.iteration_s;
  };
  const ModelSpec& model = ctx_.model;
  const std::size_t blocks = forward_flops_.size(), last = blocks - 1;
  Reference ref;
  ref.microbatch_s.assign(blocks, 0.0);
  ref.step_s.assign(blocks, 0.0);
  if (layers_alike_) {
    double t[2][2];
    for (int layers = 1; layers <= 2; ++layers) {
      ModelSpec cut = model;
      cut.layers = layers;
      for (int k_mb = 1; k_mb <= 2; ++k_mb) {
        MT_ASSIGN(t[layers - 1][k_mb - 1], time(cut, k_mb));
      }
    }
    const double d = t[1][1] - t[1][0] - t[0][1] + t[0][0];
    const double c = t[0][1] - t[0][0] - d;
    const double b = t[1][0] - t[0][0] - d;
    const double a = t[0][0] - b - c - d;
    for (std::size_t i = 1; i < last; ++i) ref.microbatch_s[i] = std::max(0.0, d), ref.step_s[i] = std::max(0.0, b);
    // The embedding's lookup is cheap next to the head's GEMM and loss: c goes to the head, a is split by parameters.
    ref.microbatch_s[last] = std::max(0.0, c);
    const double ends = parameters_[0] + parameters_[last];
    for (std::size_t i : {std::size_t{0}, last})
      ref.step_s[i] = std::max(0.0, a) * (ends > 0 ? parameters_[i] / ends : 0.5);
    return ref;
  }
  MT_ASSIGN(const double t1, time(model, 1));
  MT_ASSIGN(const double t2, time(model, 2));
  const double microbatch = std::max(0.0, t2 - t1), step = std::max(0.0, t1 - microbatch);
  const Recompute rc = k.recompute;
  double work = 0, params = 0;
  for (std::size_t i = 0; i < blocks; ++i) {
    const bool body = i != 0 && i != last;
    ref.microbatch_s[i] = 3 * forward_flops_[i] + (body && rc == Recompute::full ? forward_flops_[i] : 0) +
                          (body && rc == Recompute::selective ? attention_flops_[i] : 0);
    work += ref.microbatch_s[i], params += parameters_[i];
  }
  for (std::size_t i = 0; i < blocks; ++i) {
    ref.microbatch_s[i] = work > 0 ? microbatch * ref.microbatch_s[i] / work : microbatch / blocks;
    ref.step_s[i] = params > 0 ? step * parameters_[i] / params : step / blocks;
  }
  return ref;
}

Status FastEstimator::fit_collective(const CollectiveKey& key) {
  const auto [kind, n, stride] = key;
  if (!cluster_) return make_error("the cluster of {} GPUs could not be built", ctx_.gpus);
  sim::CollectiveRequest r;
  r.kind = static_cast<sim::CollectiveKind>(kind);
  for (int i = 0; i < n; ++i) r.members.push_back(i * stride);
  const sim::CostConstants constants;
  double t[2];
  const double sizes[2] = {1 << 20, 1 << 30};
  sim::StepCosts costs;  // both sizes route the same flows
  for (int i = 0; i < 2; ++i) {
    r.bytes = sizes[i];
    MT_ASSIGN(const sim::CollectivePlan plan, sim::plan_collective(*cluster_, constants, r, &costs));
    t[i] = sim::to_seconds(sim::analytic_time(*cluster_, constants, plan, &costs));
  }
  CollectiveFit fit;
  fit.per_byte = std::max(0.0, (t[1] - t[0]) / (sizes[1] - sizes[0]));
  fit.latency = std::max(0.0, t[0] - fit.per_byte * sizes[0]);
  collectives_[key] = fit;
  return {};
}

double FastEstimator::collective_s(sim::CollectiveKind kind, int members, int stride, double bytes) const {
  const CollectiveFit& f = collectives_.at({static_cast<int>(kind), members, stride});
  return f.latency + f.per_byte * bytes;
}

double FastEstimator::pcie_s(double bytes) const {
  // As SimCluster::host_copy: the line rate at the copy efficiency unless a calibration measured "pcie".
  bool measured = false;
  if (options_.calibration != nullptr)
    for (const auto& l : options_.calibration->links) measured = measured || l.kind == "pcie";
  const sim::ClusterSpec& s = options_.cluster;
  const double sharing = std::min(s.gpus_per_pcie_switch, ctx_.gpus);
  const double rate = s.pcie_bandwidth * (measured ? 1.0 : sim::CostConstants{}.pcie_copy_efficiency) / sharing;
  return sim::to_seconds(s.pcie_latency) + bytes / rate;
}

Status FastEstimator::prepare(const std::vector<const Plan*>& plans) {
  std::set<Key> wanted;
  std::set<CollectiveKey> groups;
  using K = sim::CollectiveKind;
  for (const Plan* p : plans) {
    wanted.insert(key_of(*p));
    // The ranks holding the same parameters, and the same experts.
    for (bool experts : {false, true}) {
      const Replicas g = replicas_of(*p, experts);
      if (g.members > 1 && (!experts || model_io(ctx_.model).routes_to_experts))
        for (K k : {K::kAllReduce, K::kReduceScatter, K::kAllGather, K::kAllToAll})
          if (k != K::kAllToAll || p->grad_compression == GradCompression::one_bit)
            groups.insert({static_cast<int>(k), g.members, g.stride});
    }
    if (p->pp > 1) groups.insert({static_cast<int>(K::kSendRecv), 2, p->tp * p->dp * p->cp});
  }
  for (const CollectiveKey& g : groups)
    if (!collectives_.count(g)) MT_TRY(fit_collective(g).context("fast tier: timing a collective"));
  return add_references(std::vector<Key>(wanted.begin(), wanted.end()), "one stage");
}

std::size_t FastEstimator::reference_simulations() const { return refs_.size() * (layers_alike_ ? 4 : 2); }

namespace {

// The gradients' compression on the wire: none without replicas to reduce over.
GradCompression wire_compression(const Plan& p) {
  return FastEstimator::replicas_of(p, false).members > 1 ? p.grad_compression : GradCompression::none;
}

// A block's forward share of its forward and backward.
double forward_share(const Plan& p) { return p.recompute == Recompute::full ? 0.25 : 1.0 / 3.0; }

// ZeRO 2 and 3 reduce-scatter each block's gradients after every
// micro-batch's backward of it, unless zero_reduce_once leaves it to once per step.
bool reduces_per_microbatch(const Plan& p) { return p.zero >= 2 && !(p.zero_reduce_once && p.microbatches() > 1); }

}  // namespace

double FastEstimator::receive_hops(const Plan& p, int stage) {
  // A stage receives each micro-batch's activations before each chunk's forward and its gradients before
  // each chunk's backward (not the model's first input, nor the loss's gradient), on its compute stream
  // (PipelineExecutor): the transfer is the stage's, micro-batch by micro-batch. Under overlap_p2p_comm
  // they run under the compute before them.
  if (p.pp == 1 || p.overlap_p2p_comm) return 0;
  return 2.0 * p.vpp - (stage == 0 ? 1 : 0) - (stage == p.pp - 1 ? 1 : 0);
}

double FastEstimator::fill_drain_hops(const Plan& p) {
  // The fill and the drain each wait for one micro-batch's hops through every virtual stage: under the
  // interleaved schedule a stage's first chunk round ends before the micro-batch it started has come
  // back round the pipeline to its next chunk.
  return p.pp == 1 ? 0 : 2.0 * (p.pp * p.vpp - 1);
}

FastEstimator::Replicas FastEstimator::replicas_of(const Plan& p, bool experts) {
  if (!experts) return {p.dp * p.cp, p.tp};
  const int etp = p.expert_tp();
  return {p.tp * p.cp * p.dp / (etp * p.ep), etp * p.ep};
}

double FastEstimator::reduce_scatter_s(const Plan& p, double elements, Replicas g) const {
  using K = sim::CollectiveKind;
  const GradCompression compression = wire_compression(p);
  const double wire = elements * wire_bytes(p, compression);
  const double kernels = sim::to_seconds(cost_.memory_bound(elements * compression_kernel_bytes(compression)));
  if (compression == GradCompression::one_bit) return collective_s(K::kAllToAll, g.members, g.stride, wire) + kernels;
  return collective_s(K::kReduceScatter, g.members, g.stride, wire) + kernels;
}

double FastEstimator::all_reduce_s(const Plan& p, double elements, Replicas g) const {
  using K = sim::CollectiveKind;
  const GradCompression compression = wire_compression(p);
  const double wire = elements * wire_bytes(p, compression);
  const double kernels = sim::to_seconds(cost_.memory_bound(elements * compression_kernel_bytes(compression)));
  if (compression == GradCompression::one_bit)
    return collective_s(K::kAllToAll, g.members, g.stride, wire) + collective_s(K::kAllGather, g.members, g.stride, wire) +
           kernels;
  return collective_s(K::kAllReduce, g.members, g.stride, wire) + kernels;
}

double FastEstimator::fp8_share(std::ptrdiff_t block, bool experts) const {
  auto sum = [&](const std::vector<double>& v) {
    return block >= 0 ? v[static_cast<std::size_t>(block)] : std::accumulate(v.begin(), v.end(), 0.0);
  };
  const double fp8 = experts ? sum(fp8_expert_parameters_) : sum(fp8_parameters_) - sum(fp8_expert_parameters_);
  const double all = experts ? sum(expert_parameters_) : sum(parameters_) - sum(expert_parameters_);
  return all > 0 ? fp8 / all : 0.0;
}

double FastEstimator::zero3_weight_casts_s(const Plan& p, std::size_t i) const {
  if (p.zero != 3 || p.precision != Precision::fp8) return 0;
  // Each use casts the gathered weights (Fp8Scaling): the forward, a full recomputation's forward and the
  // backward, where the reference (ZeRO 0) casts them once a step.
  const double uses = p.recompute == Recompute::full ? 3 : 2;
  const double fp8_experts = fp8_expert_parameters_[i] / (p.ep * p.expert_tp());
  const double fp8_dense = (fp8_parameters_[i] - fp8_expert_parameters_[i]) / p.tp;
  double t = 0;
  for (const double n : {fp8_dense, fp8_experts}) {
    if (n <= 0) continue;
    // Read the bf16 weight, write its cast and transpose (and the f32 amax); current scaling's amax pass first.
    double cast = sim::to_seconds(cost_.memory_bound(4.0 * n + 8, "fp8_cast"));
    if (p.fp8_recipe == Fp8Recipe::current)
      cast += sim::to_seconds(cost_.memory_bound(4, "fill")) + sim::to_seconds(cost_.memory_bound(2.0 * n + 8, "amax"));
    t += uses * cast;
  }
  return t;
}

double FastEstimator::gather_s(const Plan& p, double params, double fp8_share, Replicas g) const {
  // Under fp8_param_gather the FP8 linears' weights cross at one byte (GradientBuckets::gather).
  const double wide = element_bytes(p.precision);
  const double bytes = p.fp8_param_gather ? fp8_share + (1 - fp8_share) * wide : wide;
  double t = collective_s(sim::CollectiveKind::kAllGather, g.members, g.stride, params * bytes);
  if (p.offload == Offload::params) t += pcie_s(params / g.members * 4);
  return t;
}

double FastEstimator::shard(const Plan& p, const MemoryFit& fit, const std::vector<LayerRange>& ranges) const {
  // The most loaded stage's count over its unsharded blocks.
  const std::size_t last = forward_flops_.size() - 1;
  double unsharded = 0;
  for (int ch = 0; ch < p.vpp; ++ch) {
    const LayerRange r = ranges[static_cast<std::size_t>(ch * p.pp + fit.peak_stage)];
    for (int l = r.begin; l < r.end; ++l) unsharded += parameters_[static_cast<std::size_t>(l + 1)];
  }
  if (fit.peak_stage == 0) unsharded += parameters_[0];
  if (fit.peak_stage == p.pp - 1) unsharded += parameters_[last];
  return unsharded > 0 ? static_cast<double>(fit.max_stage_parameters) / unsharded : 1.0 / p.tp;
}

double FastEstimator::block_s(const Plan& p, const Reference& ref, std::size_t i, double shard) const {
  // ZeRO 2 and 3 reduce-scatter the block's gradients on the side stream; ZeRO 3
  // also gathers its parameters (prefetched one block ahead) before its forward
  // and backward. A block's pass then takes at least as long as its communication.
  double t = ref.microbatch_s[i];
  if (p.zero < 2) return t;
  // The block's parameters on this rank: routed experts split over ep·etp, reduced and gathered over their
  // expert-data group; the rest (split over tp) over dp·cp. A block without experts: the stage's share.
  const double e = expert_parameters_[i];
  const double experts = e / (p.ep * p.expert_tp());
  const double dense = e > 0 ? (parameters_[i] - e) / p.tp : parameters_[i] * shard;
  double reduce = 0, gather = 0;
  for (const bool routed : {false, true}) {
    const double params = routed ? experts : dense;
    const Replicas group = replicas_of(p, routed);
    if (params <= 0 || group.members == 1) continue;
    if (reduces_per_microbatch(p)) reduce += reduce_scatter_s(p, params, group);
    if (p.zero == 3) gather += gather_s(p, params, fp8_share(static_cast<std::ptrdiff_t>(i), routed), group);
  }
  t += zero3_weight_casts_s(p, i);
  const double fwd = forward_share(p);
  return std::max(t * fwd, gather) + std::max(t * (1 - fwd), gather + reduce);
}

FastEstimator::StageTimes FastEstimator::stage_times(const Plan& p, const MemoryFit& fit, const Reference& ref) const {
  // Every chunk's layers, once.
  const std::vector<LayerRange> ranges = virtual_stage_ranges(ctx_.model, p.stage_split());
  const std::size_t last = forward_flops_.size() - 1;
  const double share = shard(p, fit, ranges);
  StageTimes out;
  out.microbatch_s.assign(static_cast<std::size_t>(p.pp), 0.0);
  out.step_s.assign(static_cast<std::size_t>(p.pp), 0.0);
  out.once_s.assign(static_cast<std::size_t>(p.pp), 0.0);
  auto once = [&](std::size_t i) { return ref.once_s.empty() ? 0.0 : ref.once_s[i]; };
  for (int s = 0; s < p.pp; ++s) {
    double t = 0, w = 0, o = 0;
    for (int ch = 0; ch < p.vpp; ++ch) {
      const LayerRange r = ranges[static_cast<std::size_t>(ch * p.pp + s)];
      for (int l = r.begin; l < r.end; ++l) {
        t += block_s(p, ref, static_cast<std::size_t>(l + 1), share);
        w += ref.step_s[static_cast<std::size_t>(l + 1)];
        o += once(static_cast<std::size_t>(l + 1));
      }
    }
    if (s == 0) t += block_s(p, ref, 0, share), w += ref.step_s[0], o += once(0);
    if (s == p.pp - 1) t += block_s(p, ref, last, share), w += ref.step_s[last], o += once(last);
    // ZeRO 3 without prefetch across chunks prefetches within a chunk's pass
    // only: each pass (a chunk's forward or backward of a micro-batch) first
    // waits for its first block's gather. With it (the default) the gather
    // is issued at the end of the previous action and hides behind the bubble or the compute.
    if (p.zero == 3 && replicas_of(p, false).members > 1 && !p.prefetch_across_chunks)
      t += 2 * p.vpp * gather_s(p, parameters_[1] * share, fp8_share(1, false), replicas_of(p, false));
    out.microbatch_s[static_cast<std::size_t>(s)] = t;
    out.step_s[static_cast<std::size_t>(s)] = w;
    out.once_s[static_cast<std::size_t>(s)] = o;
  }
  return out;
}

void FastEstimator::add_pipeline(const Plan& p, const StageTimes& stages, FastBreakdown& b) const {
  const ModelSpec& m = ctx_.model;
  double hop = 0;
  if (p.pp > 1) {
    const double bytes = static_cast<double>(p.micro_batch) * p.effective_seq_len(m) / p.cp * m.hidden *
                         element_bytes(p.precision);
    hop = collective_s(sim::CollectiveKind::kSendRecv, 2, p.tp * p.dp * p.cp, bytes);
  }
  std::vector<double> stage_s = stages.microbatch_s;
  for (int s = 0; s < p.pp; ++s) stage_s[static_cast<std::size_t>(s)] += receive_hops(p, s) * hop;
  const double t_max = *std::max_element(stage_s.begin(), stage_s.end());
  double t_mean = 0;
  for (double t : stage_s) t_mean += t / p.pp;
  const double v = p.vpp;
  // EP all-to-all overlap: the fill and drain run unpaired passes, each what a pair saves slower
  // (StageTimes::once_s is that saving over a stage's layers, per micro-batch).
  double once_mean = 0;
  for (double o : stages.once_s) once_mean += o / p.pp;
  b.bubble_s = (p.pp - 1) * (t_mean + once_mean) / v;
  b.p2p_s = fill_drain_hops(p) * hop;
  b.pipeline_s = p.microbatches() * t_max + b.bubble_s + b.p2p_s +
                 *std::max_element(stages.once_s.begin(), stages.once_s.end());
}

double FastEstimator::optimizer_s(const Plan& p, double params, double owned, double buckets,
                                  const std::vector<double>& stage_step_s) const {
  // The reference stage updates all its parameters (ZeRO 0); a rank updates `owned` of them.
  const double share = params > 0 ? owned / params : 1.0;
  if (p.offload == Offload::none) return *std::max_element(stage_step_s.begin(), stage_step_s.end()) * share;
  // Bucket by bucket: gradients down, the host's AdamW (28 bytes an fp32
  // parameter, the node's ranks sharing its CPUs), the master back up.
  const double down = pcie_s(owned * 4), up = pcie_s(owned * 4);
  const double host = sim::to_seconds(cost_.host_adamw(owned * 28, std::min(ctx_.gpus_per_node, ctx_.gpus)));
  const double slowest = std::max({down, up, host});
  return slowest + (down + up + host - slowest) / buckets;
}

void FastEstimator::add_update(const Plan& p, const MemoryFit& fit, const StageTimes& stages, FastBreakdown& b) const {
  const double params = static_cast<double>(fit.max_stage_parameters);
  // Routed experts are reduced, updated and gathered over their expert-data group, the rest over dp·cp.
  struct Part {
    double params;
    Replicas group;
    double fp8_share;  // of the FP8 linears' weights, the whole model's share
  };
  const double experts = static_cast<double>(fit.max_stage_expert_parameters);
  const Part parts[2] = {{params - experts, replicas_of(p, false), fp8_share(-1, false)},
                         {experts, replicas_of(p, true), fp8_share(-1, true)}};
  // Buckets of the flat gradient buffer (ZeRO 0, 1; dense and expert gradients apart), else one per layer.
  auto buckets_of = [&](double n) {
    return p.zero <= 1 ? std::max(1.0, n / grad_bucket_elements(p))
                       : std::max(1.0, static_cast<double>(ctx_.model.layers) / (p.pp * 1.0));
  };
  double buckets = 0, owned = 0, reduction = 0, gather = 0;
  for (const Part& part : parts) {
    if (part.params <= 0) continue;
    const double n = buckets_of(part.params);
    buckets += n;
    owned += part.params / (p.zero >= 1 ? part.group.members : 1);
    if (part.group.members == 1) continue;
    if (p.zero <= 1 || !reduces_per_microbatch(p))
      reduction += n * (p.zero == 0 ? all_reduce_s(p, part.params / n, part.group)
                                    : reduce_scatter_s(p, part.params / n, part.group));
    // ZeRO 1 and 2 all-gather the updated parameter shards after the optimizer step, bucket by bucket
    // as the engine issues them: each pays the collective's latency.
    if (p.zero == 1 || p.zero == 2) gather += n * gather_s(p, part.params / n, part.fp8_share, part.group);
  }
  buckets = std::max(1.0, buckets);
  b.optimizer_s = optimizer_s(p, params, owned, buckets, stages.step_s);
  const double t_max = *std::max_element(stages.microbatch_s.begin(), stages.microbatch_s.end());
  const double backward_last = t_max * (1 - forward_share(p));
  if (p.overlap_update) {
    // Reductions, updates and all-gathers bucket by bucket on the data-parallel stream.
    const double stream = reduction + b.optimizer_s + gather;
    const double exposed = std::max(stream - backward_last, stream / buckets);
    b.data_parallel_s = std::max(0.0, exposed - b.optimizer_s / buckets);
    b.optimizer_s /= buckets;
  } else {
    b.data_parallel_s = p.grad_sync == GradSync::after_backward
                            ? reduction
                            : std::max(reduction - backward_last, reduction / buckets);
    b.data_parallel_s += gather;
  }
}

FastBreakdown FastEstimator::estimate(const Plan& p, const MemoryFit& fit) const {
  const StageTimes stages = stage_times(p, fit, refs_.at(key_of(p)));
  FastBreakdown b;
  add_pipeline(p, stages, b);
  add_update(p, fit, stages, b);
  b.iteration_s = b.pipeline_s + b.optimizer_s + b.data_parallel_s;
  return b;
}

}  // namespace meshtrain::planner
