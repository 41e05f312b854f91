#include "engine/memory/memory_model.h"

#include <algorithm>
#include <iterator>
#include <numeric>

#include <fmt/format.h>

#include "engine/plan/fp8_recipe.h"
#include "engine/schedule/a2a_overlap.h"
#include "engine/schedule/builders.h"
#include "models/model_tables.h"
#include "models/parameters.h"

namespace meshtrain {

ActivationLayout korthikanti_layout() { return {2, 1, true, false, 0}; }

ActivationLayout meshtrain_layout(const Plan& p) {
  ActivationLayout a{element_bytes(p.precision), 0, false, true, gradient_bytes(p)};
  if (p.precision == Precision::fp8) a.gemm_input_bytes = kFp8SavedGemmInputBytes;
  return a;
}

ActivationQuery activation_query(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  ActivationQuery q;
  q.micro_batch = p.micro_batch;
  q.seq = static_cast<double>(p.effective_seq_len(m)) / p.cp;
  q.tp = p.tp;
  q.cp = p.cp;
  q.cp_ring = p.cp_comm == ContextComm::ring;
  q.expert_tp = p.expert_tp();
  q.sequence_parallel = p.sequence_parallel;
  q.recompute = p.recompute;
  q.recompute_modules = effective_recompute_modules(p);
  q.layout = a;
  return q;
}

double layer_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  return model_tables(m)->blocks[1]->activation_bytes(activation_query(m, p, a));
}

double head_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  return model_tables(m)->blocks.back()->activation_bytes(activation_query(m, p, a));
}

double layer_backward_working_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  return model_tables(m)->blocks[1]->backward_working_bytes(activation_query(m, p, a));
}

int inflight_microbatches(const Plan& p, int stage) {
  const int m = p.microbatches();
  switch (p.schedule) {
    case ScheduleKind::gpipe: return m;
    case ScheduleKind::one_f_one_b: return std::min(p.pp - stage, m);
    // Between F and W: rank r holds p-r-1 warm-up micro-batches and r waiting for W (which keep only
    // what W reads: peak_activation_bytes).
    case ScheduleKind::zb_h1: return std::min(p.pp, m);
    case ScheduleKind::interleaved:
      return std::min(schedule::interleaved_warmup({p.pp, p.vpp, m}, stage) + 1, m * p.vpp);
  }
  return m;
}

double peak_activation_bytes(const Plan& p, int stage, const std::vector<double>& chunk_bytes,
                             const std::vector<double>& deferred_bytes,
                             const std::vector<std::vector<double>>& chunk_layers) {
  // Walk the stage's schedule: a forward of chunk c keeps its bytes until that micro-batch's backward;
  // where the schedule has W passes, B frees them but for what the deferred dW reads (its GEMMs'
  // inputs and output gradients), which stays until W.
  const schedule::PipelineLayout layout{p.pp, p.vpp, p.microbatches()};
  auto built = schedule::build_schedule(p.schedule, layout);
  std::vector<schedule::Pair> pairs;  // this stage's, in row order
  if (built && p.moe_a2a_overlap) {
    schedule::PairedSchedule paired = schedule::pair_forward_backward(*built);
    *built = std::move(paired.compute);
    std::copy_if(paired.pairs.begin(), paired.pairs.end(), std::back_inserter(pairs),
                 [&](const schedule::Pair& q) { return q.forward.stage == stage; });
  }
  const auto per_chunk = [](const std::vector<double>& bytes, int chunk) {
    return bytes.empty() ? 0.0 : bytes[static_cast<std::size_t>(chunk)];
  };
  if (!built) {
    // validate_plan refuses such plans; the even-chunk bound keeps this total.
    double all = 0;
    for (double b : chunk_bytes) all += b;
    for (int c = 0; c < p.vpp; ++c) all += per_chunk(deferred_bytes, c);
    return inflight_microbatches(p, stage) * all / p.vpp;
  }
  const bool weight_pass = p.schedule == ScheduleKind::zb_h1;
  const std::vector<schedule::Action>& row = built->ranks[static_cast<std::size_t>(stage)];
  double live = 0, peak = 0;
  std::size_t next_pair = 0;
  for (std::size_t i = 0; i < row.size(); ++i) {
    const schedule::Action& a = row[i];
    const double bytes = chunk_bytes[static_cast<std::size_t>(a.chunk)];
    if (next_pair < pairs.size() && i + 1 < row.size() && pairs[next_pair] == schedule::Pair{a, row[i + 1]}) {
      ++next_pair;
      // A pair runs its forward's layer k beside its backward's layer L-1-k (Megatron's combined 1F1B;
      // no zero-bubble W pass: check_a2a_overlap refuses it): the forward keeps its layer before the
      // backward frees its own. What a chunk holds beyond its layers (the embedding's) comes first in
      // forward and goes last in backward; without layers the chunks count whole.
      static const std::vector<double> kNone;
      const auto& fl = chunk_layers.empty() ? kNone : chunk_layers[static_cast<std::size_t>(a.chunk)];
      const auto& bl = chunk_layers.empty() ? kNone : chunk_layers[static_cast<std::size_t>(row[i + 1].chunk)];
      const double freed = chunk_bytes[static_cast<std::size_t>(row[i + 1].chunk)];
      live += bytes - std::accumulate(fl.begin(), fl.end(), 0.0);
      peak = std::max(peak, live);
      for (std::size_t k = 0; k < std::max(fl.size(), bl.size()); ++k) {
        if (k < fl.size()) peak = std::max(peak, live += fl[k]);
        if (k < bl.size()) live -= bl[bl.size() - 1 - k];
      }
      live -= freed - std::accumulate(bl.begin(), bl.end(), 0.0);
      ++i;
      continue;
    }
    if (a.kind == schedule::Action::forward) live += bytes;
    else if (a.kind == schedule::Action::backward) live += (weight_pass ? per_chunk(deferred_bytes, a.chunk) : 0.0) - bytes;
    else if (a.kind == schedule::Action::weight) live -= per_chunk(deferred_bytes, a.chunk);
    else continue;
    peak = std::max(peak, live);
  }
  return peak;
}

MemoryBreakdown& MemoryBreakdown::operator+=(const MemoryBreakdown& o) {
  parameter_count += o.parameter_count;
  expert_parameter_count += o.expert_parameter_count;
  parameters += o.parameters;
  gradients += o.gradients;
  optimizer += o.optimizer;
  zero3_working += o.zero3_working;
  gradient_working += o.gradient_working;
  gradient_shard += o.gradient_shard;
  activations += o.activations;
  backward_working += o.backward_working;
  inflight = std::max(inflight, o.inflight);
  offloaded += o.offloaded;
  host += o.host;
  return *this;
}

namespace {

// A stage's rank's share of the parameters and the bytes per element its
// state is kept in.
struct StageShare {
  const Plan& p;
  double n = 0;        // parameters of the stage on this rank (its tp/ep shard)
  double experts = 0;  // of which expert parameters
  double edp = 1;      // the expert-data group: tp·cp·dp / (etp·ep) ranks
  double param_bytes = 0, grad_bytes = 0;
  // Precision fp8: of n, the weights of FP8 linears (is_fp8_linear), and of those the experts'.
  double fp8_n = 0, fp8_experts = 0;

  // `bytes` per parameter of `count` (of which `expert_count` experts'), or
  // under ZeRO `stage_needed` and above the share of it a rank holds: dense
  // parameters sharded over dp·cp (the ranks that hold the same parameters),
  // expert ones over their expert-data group.
  double sharded_of(int stage_needed, double count, double expert_count, double bytes) const {
    if (p.zero < stage_needed) return count * bytes;
    if (expert_count == 0) return count * bytes / (static_cast<double>(p.dp) * p.cp);
    return ((count - expert_count) / (static_cast<double>(p.dp) * p.cp) + expert_count / edp) * bytes;
  }
  double sharded(int stage_needed, double bytes) const { return sharded_of(stage_needed, n, experts, bytes); }
};

// Parameters, gradients and optimizer state; what offload moves to the host;
// 1-bit compression's error feedback.
void add_model_state(MemoryBreakdown& r, const StageShare& share) {
  const Plan& p = share.p;
  const double optimizer_bytes = p.precision != Precision::fp32 ? 12.0 : 8.0;
  r.parameters = share.sharded(3, share.param_bytes);
  if (share.fp8_n > 0) {
    // Transformer Engine's FP8 copy of each FP8 linear's weight, the cast and its transpose
    // (engine/plan/fp8_recipe.h), kept over the step below ZeRO 3; under fp8_param_gather it is the
    // parameter, and the 16-bit copy is gone. ZeRO 3 casts each gathered layer as it uses it
    // (add_zero_working), and with FP8 parameters its shards are FP8 values, a byte each.
    if (p.zero < 3)
      r.parameters += share.fp8_n * (p.fp8_param_gather ? kFp8WeightBytes - share.param_bytes : kFp8WeightBytes);
    else if (p.fp8_param_gather)
      r.parameters -= share.sharded_of(3, share.fp8_n, share.fp8_experts, share.param_bytes - 1);
  }
  r.gradients = share.sharded(2, share.grad_bytes);
  r.optimizer = share.sharded(1, optimizer_bytes);
  if (p.offload != Offload::none) {
    r.offloaded = r.optimizer;
    r.optimizer = 0;
    r.host = share.sharded(1, 16.0);
    if (p.offload == Offload::params) {
      r.offloaded += r.parameters;
      r.parameters = 0;
    }
  }
  // 1-bit gradients keep their error feedback across steps like optimizer state
  // (engine/parallel/grad_compression.h): an fp32 worker error as large as the
  // gradients, and under ZeRO 0 a server error of the rank's 1/dp block.
  if (p.grad_compression == GradCompression::one_bit && p.error_feedback && p.dp > 1)
    r.optimizer += share.n * 4.0 * (1.0 + (p.zero == 0 ? 1.0 / p.dp : 0.0));
}

// ZeRO's working buffers: under 2/3 the largest body layer's shard gathered
// (and its gradient) and a tied embedding's gradient; under 1 the gradient
// shard a rank reduces into.
void add_zero_working(MemoryBreakdown& r, const StageShare& share, const ModelSpec& m, const ModelTables& tables,
                      int stage, int layers_per_chunk) {
  const Plan& p = share.p;
  if (p.zero == 1) r.gradient_shard = share.sharded(1, share.grad_bytes);
  if (p.zero < 2) return;
  // The largest body layer's shard, one layer of each run of alike layers (ModelTables::runs).
  // Of the largest layer, the weights of FP8 linears (precision fp8).
  std::int64_t largest_layer = 0, largest_fp8 = 0, tied_embedding = 0;
  for (const LayerRun& run : tables.runs) {
    std::int64_t layer = 0, fp8 = 0;
    for (std::size_t i : run.tensors) {
      const ParamInfo& info = tables.parameters[i];
      const std::int64_t n = shard_numel(m, info, p.tp, p.ep, p.expert_tp());
      layer += n;
      if (share.fp8_n > 0 && is_fp8_linear(info)) fp8 += n;
      if (info.name == "embed.tokens" && m.tied_embeddings) tied_embedding = shard_numel(m, info, p.tp, p.ep);
    }
    if (run.begin < m.layers && run.end > 0 && layer > largest_layer) largest_layer = layer, largest_fp8 = fp8;
  }
  // A chunk of one layer has no next layer to prefetch within its pass.
  const double gathered = layers_per_chunk > 1 ? 2.0 : 1.0;
  // Reduced once per step after several micro-batches, every layer's gradient stays until the last one.
  const bool whole = p.zero_reduce_once && p.microbatches() > 1;
  const double layer_grads = whole ? 0.0 : share.grad_bytes;
  if (p.zero >= 3) {
    r.zero3_working = static_cast<double>(largest_layer) * (gathered * share.param_bytes + layer_grads);
    // FP8 without FP8 parameters: the layer in use is cast with its transpose as it is used (with them
    // the gathered FP8 values and their transpose take the 16-bit weights' place).
    if (!p.fp8_param_gather) r.zero3_working += static_cast<double>(largest_fp8) * kFp8WeightBytes;
  } else {
    r.gradient_working = static_cast<double>(largest_layer) * layer_grads;
  }
  if (whole) r.gradient_working = share.n * share.grad_bytes;
  else if (stage == 0 || stage == p.pp - 1) r.gradient_working += static_cast<double>(tied_embedding) * share.grad_bytes;
}

// The activations a stage holds at its peak, and the largest backward working set.
void add_activations(MemoryBreakdown& r, const ModelSpec& m, const Plan& p, int stage, const ActivationLayout& a,
                     const ModelTables& tables, const std::vector<LayerRange>& ranges) {
  auto chunk = [&](int c) { return ranges[static_cast<std::size_t>(c * p.pp + stage)]; };
  r.inflight = inflight_microbatches(p, stage);
  // Each chunk's bytes per micro-batch (its body blocks; hook index h is block h + 1, and the embedding
  // with virtual stage 0), which may differ (StageSplit: uneven and flexible layouts).
  const ModelBlocks& blocks = tables.blocks;
  const ActivationQuery q = activation_query(m, p, a);
  std::vector<double> chunk_bytes(static_cast<std::size_t>(p.vpp), 0.0), deferred_bytes = chunk_bytes;
  std::vector<std::vector<double>> chunk_layers(static_cast<std::size_t>(p.vpp));
  for (int c = 0; c < p.vpp; ++c) {
    for (int l = chunk(c).begin; l < chunk(c).end; ++l) {
      const BlockDef& block = *blocks[static_cast<std::size_t>(l + 1)];
      chunk_bytes[static_cast<std::size_t>(c)] += block.activation_bytes(q);
      chunk_layers[static_cast<std::size_t>(c)].push_back(block.activation_bytes(q));
      if (p.schedule == ScheduleKind::zb_h1) deferred_bytes[static_cast<std::size_t>(c)] += block.deferred_weight_bytes(q);
      r.backward_working = std::max(r.backward_working, block.backward_working_bytes(q));
    }
  }
  if (stage == 0 && p.embedding) chunk_bytes.front() += blocks.front()->activation_bytes(q);
  r.activations = peak_activation_bytes(p, stage, chunk_bytes, deferred_bytes, chunk_layers);
  if (stage == p.pp - 1) {
    // The head's backward frees a micro-batch's logits before any layer's backward of that micro-batch
    // starts: the stage peaks with the one working set or the other (the head's: its saved tensors and
    // the logits' gradient), not both.
    const int head_inflight = p.schedule == ScheduleKind::gpipe ? p.microbatches() : 1;
    const double head = blocks.back()->activation_bytes(q);
    r.activations += (head_inflight - 1) * head;
    r.backward_working = std::max(r.backward_working, head + blocks.back()->backward_working_bytes(q));
  }
}

}  // namespace

MemoryBreakdown memory_per_rank(const ModelSpec& m, const Plan& p, int stage, const ActivationLayout& a) {
  MemoryBreakdown r;
  const std::shared_ptr<const ModelTables> tables = model_tables(m);
  const ShardCount shard = count_shard_parameters(m, p.tp, p.stage_split(), p.ep, stage, p.expert_tp());
  r.parameter_count = shard.total;
  r.expert_parameter_count = shard.expert;
  StageShare share{p};
  share.n = static_cast<double>(shard.total);
  share.experts = static_cast<double>(shard.expert);
  share.edp = static_cast<double>(p.tp * p.cp * p.dp) / (p.expert_tp() * p.ep);
  share.param_bytes = element_bytes(p.precision);
  if (p.precision == Precision::fp8) {
    share.fp8_n = static_cast<double>(shard.fp8_linear);
    share.fp8_experts = static_cast<double>(shard.fp8_linear_expert);
  }
  share.grad_bytes = a.gradient_bytes > 0 ? a.gradient_bytes : element_bytes(p.precision);
  add_model_state(r, share);
  // Every virtual stage's layers at once (vpp grows with deep models), and the
  // most layers one of this stage's chunks holds (the plan's split, even or not).
  const std::vector<LayerRange> ranges = virtual_stage_ranges(m, p.stage_split());
  int layers_per_chunk = 0;
  for (int c = 0; c < p.vpp; ++c) {
    const LayerRange& range = ranges[static_cast<std::size_t>(c * p.pp + stage)];
    layers_per_chunk = std::max(layers_per_chunk, range.end - range.begin);
  }
  add_zero_working(r, share, m, *tables, stage, layers_per_chunk);
  add_activations(r, m, p, stage, a, *tables, ranges);
  return r;
}

}  // namespace meshtrain
