#include "engine/planner/plan_estimate.h"

#include <algorithm>
#include <cstdlib>

#include "engine/plan/segment_plan.h"
#include "engine/step/step_engine.h"
#include "models/model_tables.h"

namespace meshtrain::planner {

namespace {

using K = sim::CollectiveKind;

bool same_ranks(const Plan& a, const Plan& b) {
  return a.first_rank == b.first_rank && a.world_size() == b.world_size();
}

}  // namespace

PlanEstimator::PlanEstimator(const SearchContext& ctx, const SimulateOptions& options)
    : ctx_(ctx), fast_(ctx, options) {
  const std::int64_t seq = ctx.base.effective_seq_len(ctx.model);
  for (const auto& b : model_tables(ctx.model)->blocks) io_.push_back(b->io(seq));
}

Status PlanEstimator::prepare(const std::vector<const Plan*>& plans) {
  std::vector<const Plan*> uniform, segmented;
  for (const Plan* p : plans) (p->segments.empty() ? uniform : segmented).push_back(p);
  if (!uniform.empty()) MT_TRY(fast_.prepare(uniform));
  if (!segmented.empty()) MT_TRY(prepare_segments(segmented));
  return {};
}

FastBreakdown PlanEstimator::estimate(const Plan& p, const MemoryFit& fit) const {
  return p.segments.empty() ? fast_.estimate(p, fit) : compose_segments(p);
}

Status PlanEstimator::prepare_segments(const std::vector<const Plan*>& plans) {
  std::set<FastEstimator::Key> wanted;
  std::set<FastEstimator::CollectiveKey> groups;
  auto group = [&](K kind, int members, int stride) {
    if (members > 1) groups.insert({static_cast<int>(kind), members, stride});
  };
  for (const Plan* p : plans)
    for (std::size_t k = 0; k < p->segments.size(); ++k) {
      const Plan& s = p->segments[k];
      wanted.insert(FastEstimator::key_of(s));
      for (K kind : {K::kAllReduce, K::kReduceScatter, K::kAllGather}) group(kind, s.dp, s.tp);
      group(K::kSendRecv, s.pp > 1 ? 2 : 1, s.tp * s.dp);
      group(K::kAllReduce, s.tp, 1);
      if (k == 0) continue;
      const Plan& before = p->segments[k - 1];
      if (same_ranks(before, s)) group(K::kAllToAll, s.world_size(), 1);
      else group(K::kSendRecv, 2, std::max(1, std::abs(s.first_rank - before.first_rank)));
    }
  for (const auto& g : groups)
    if (!fast_.collectives_.count(g)) MT_TRY(fast_.fit_collective(g).context("fast tier: timing a collective"));
  // The whole model at each key; a key it refuses (its tp does not divide
  // every module's heads) comes from the tp 1 reference at the same micro-batch.
  {
    std::vector<FastEstimator::Key> keys;
    for (const auto& k : wanted) {
      if (fast_.refs_.count(k) || scaled_.count(k)) continue;
      if (k.tp > 1 && !whole_model_takes(k)) {
        scaled_.insert(k);
        const FastEstimator::Key tp1 = k.without_tp();
        if (!fast_.refs_.count(tp1)) keys.push_back(tp1);
      } else {
        keys.push_back(k);
      }
    }
    MT_TRY(fast_.add_references(std::move(keys), "one segment's blocks"));
  }
  return {};
}

// Whether the whole model runs one stage at `key` (the reference the uniform tier simulates): a segment's tp
// need only divide its own modules' heads.
bool PlanEstimator::whole_model_takes(const FastEstimator::Key& key) const {
  Plan p = key.reference_plan(ctx_.base);
  p.global_batch = p.micro_batch * p.dp;
  return validate_plan(p, ctx_.model).ok() && StepEngine::supports(p, ctx_.step).ok();
}

double PlanEstimator::boundary_bytes(const Plan& producer, std::int64_t samples) const {
  const BlockIo& io = io_[static_cast<std::size_t>(block_range(producer, ctx_.model).last)];
  return static_cast<double>(samples) * static_cast<double>(io.tokens_out * io.width_out) *
         element_bytes(producer.precision);
}

double PlanEstimator::boundary_s(const Plan& producer, const Plan& consumer) const {
  if (same_ranks(producer, consumer))
    // One all-to-all: each rank sends its replica's whole activation out.
    return fast_.collective_s(K::kAllToAll, consumer.world_size(), 1,
                              boundary_bytes(producer, producer.effective_global_batch() / producer.dp));
  // A downstream stage: each consumer micro-batch's samples, as a send/recv (replicas in parallel).
  return fast_.collective_s(K::kSendRecv, 2, std::max(1, std::abs(consumer.first_rank - producer.first_rank)),
                            boundary_bytes(producer, consumer.micro_batch));
}

PlanEstimator::Terms PlanEstimator::segment_terms(const Plan& s) const {
  const ModelSpec& m = ctx_.model;
  const FastEstimator::Key key = FastEstimator::key_of(s);
  const bool scaled = scaled_.count(key) > 0;
  const FastEstimator::Reference& ref = fast_.refs_.at(scaled ? key.without_tp() : key);
  const double divide = scaled ? s.tp : 1;
  const std::size_t last = io_.size() - 1;
  const double forward_share = s.recompute == Recompute::full ? 0.25 : 1.0 / 3.0;
  const int n = s.dp;
  const FastEstimator::Replicas replicas{n, s.tp};  // as the reduce-scatters below: the dp ranks, tp apart
  const double act = element_bytes(s.precision);
  auto params = [&](std::size_t i) { return fast_.parameters_[i] / s.tp; };
  auto block_time = [&](std::size_t i) {
    double t = ref.microbatch_s[i] / divide;
    if (scaled && i != 0 && i != last) {
      const double bytes = static_cast<double>(s.micro_batch) * io_[i].tokens_out * io_[i].width_out * act;
      t += (s.recompute == Recompute::full ? 6 : 4) * fast_.collective_s(K::kAllReduce, s.tp, 1, bytes);
    }
    t += fast_.zero3_weight_casts_s(s, i);  // this rank's own casts: not scaled from a tp 1 reference
    if (s.zero < 2 || n == 1) return t;
    // As the uniform tier: ZeRO 2 reduce-scatters every micro-batch's
    // gradients of the block, ZeRO 3 also gathers its parameters first.
    const double reduce = fast_.collective_s(K::kReduceScatter, n, s.tp, params(i) * gradient_bytes(s));
    const double gather =
        s.zero == 3 ? fast_.gather_s(s, params(i), fast_.fp8_share(static_cast<std::ptrdiff_t>(i), false), replicas) : 0;
    return std::max(t * forward_share, gather) + std::max(t * (1 - forward_share), gather + reduce);
  };
  const double hop =
      s.pp > 1 ? fast_.collective_s(K::kSendRecv, 2, s.tp * s.dp, boundary_bytes(s, s.micro_batch)) : 0;
  // The FP8 linears' weights of block i on this rank (a segment has no routed experts).
  auto fp8_params = [&](std::size_t i) { return fast_.fp8_parameters_[i] / s.tp; };
  double t_max = 0, t_sum = 0, step_max = 0, params_max = 0, fp8_of_max = 0;
  const std::vector<LayerRange> ranges = virtual_stage_ranges(m, s.stage_split());
  for (int stage = 0; stage < s.pp; ++stage) {
    std::vector<std::size_t> blocks;
    for (int ch = 0; ch < s.vpp; ++ch) {
      const LayerRange r = ranges[static_cast<std::size_t>(ch * s.pp + stage)];
      for (int l = r.begin; l < r.end; ++l) blocks.push_back(static_cast<std::size_t>(l + 1));
    }
    if (stage == 0 && s.embedding) blocks.push_back(0);
    if (stage == s.pp - 1 && s.head) blocks.push_back(last);
    double t = 0, step = 0, stage_params = 0, stage_fp8 = 0;
    for (std::size_t i : blocks)
      t += block_time(i), step += ref.step_s[i] / divide, stage_params += params(i), stage_fp8 += fp8_params(i);
    t += FastEstimator::receive_hops(s, stage) * hop;  // as the uniform tier
    t_max = std::max(t_max, t), t_sum += t;
    step_max = std::max(step_max, step);
    if (stage_params > params_max) params_max = stage_params, fp8_of_max = stage_fp8;
  }
  Terms out;
  out.backward_share = 1 - forward_share;
  const double t_mean = t_sum / s.pp;
  out.p2p = FastEstimator::fill_drain_hops(s) * hop;
  out.pipeline = s.microbatches() * t_max + (s.pp - 1) * t_mean + out.p2p;
  // One micro-batch through the segment: its stages, and the hops between them (in t_sum already where
  // the receives are on the compute stream).
  out.latency = t_sum + (s.overlap_p2p_comm ? out.p2p : 0);
  out.bubble = (s.pp - 1) * t_mean;
  out.optimizer = step_max / (s.zero >= 1 ? n : 1);
  if (n > 1) {
    if (s.zero <= 1) {
      const double buckets = std::max(1.0, params_max / grad_bucket_elements(s));
      const double grads = params_max * gradient_bytes(s);
      const double reduce =
          buckets * fast_.collective_s(s.zero == 0 ? K::kAllReduce : K::kReduceScatter, n, s.tp, grads / buckets);
      out.data_parallel = s.grad_sync == GradSync::after_backward
                              ? reduce
                              : std::max(reduce - t_max * out.backward_share, reduce / buckets);
    }
    if (s.zero == 1 || s.zero == 2)
      out.data_parallel += fast_.gather_s(s, params_max, params_max > 0 ? fp8_of_max / params_max : 0, replicas);
  }
  return out;
}

FastBreakdown PlanEstimator::compose_segments(const Plan& p) const {
  const std::size_t n = p.segments.size();
  std::vector<Terms> terms;
  for (const Plan& s : p.segments) terms.push_back(segment_terms(s));
  // Groups of consecutive segments on the same ranks: [begin, end).
  struct Group {
    std::size_t begin = 0, end = 0;
    double time = 0, latency = 0, optimizer = 0, data_parallel = 0;
  };
  std::vector<Group> groups;
  std::vector<double> crossing;  // the disjoint boundary after group g
  FastBreakdown b;
  for (std::size_t k = 0; k < n; ++k) {
    if (k == 0 || !same_ranks(p.segments[k - 1], p.segments[k])) {
      if (k > 0) crossing.push_back(boundary_s(p.segments[k - 1], p.segments[k]));
      groups.push_back({k, k});
    } else {
      groups.back().time += 2 * boundary_s(p.segments[k - 1], p.segments[k]);  // the reshard, forward and backward
    }
    Group& g = groups.back();
    g.end = k + 1;
    g.time += terms[k].pipeline;
    g.optimizer += terms[k].optimizer;
    g.data_parallel += terms[k].data_parallel;
    b.bubble_s += terms[k].bubble;
    b.p2p_s += terms[k].p2p;
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    Group& gr = groups[g];
    gr.latency = gr.time;
    // The segments facing a disjoint neighbour pipeline with it (at most two).
    std::set<std::size_t> facing;
    if (g > 0) facing.insert(gr.begin);
    if (g + 1 < groups.size()) facing.insert(gr.end - 1);
    for (std::size_t e : facing) gr.latency -= terms[e].pipeline - terms[e].latency;
  }
  for (double c : crossing) b.p2p_s += 2 * c;
  double pipeline = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    double t = groups[g].time;
    for (std::size_t h = 0; h < groups.size(); ++h)
      if (h != g) t += groups[h].latency;
    pipeline = std::max(pipeline, t);
  }
  for (double c : crossing) pipeline += 2 * c;
  b.pipeline_s = pipeline;
  // Downstream groups finish their backward before the gradients have crossed the groups upstream of them.
  double ahead = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) ahead += terms[groups[g - 1].begin].backward_share * groups[g - 1].latency + crossing[g - 1];
    const double end = pipeline - ahead + groups[g].optimizer + groups[g].data_parallel;
    if (end > b.iteration_s) {
      b.iteration_s = end;
      b.optimizer_s = groups[g].optimizer;
      b.data_parallel_s = groups[g].data_parallel;
    }
  }
  return b;
}

}  // namespace meshtrain::planner
