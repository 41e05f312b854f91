#include "engine/step/step_engine.h"

#include <algorithm>
#include <cmath>

#include "engine/step/step_chunk.h"
#include "models/init.h"
#include "models/parameters.h"

namespace meshtrain {

DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
    case Precision::fp8: return DType::bf16;  // values and weights stay bf16; only GEMM operands are FP8
    case Precision::fp16: return DType::f16;
    case Precision::fp32: return DType::f32;
  }
  return DType::f32;
}

DType activation_dtype(Precision p, const StepOptions& o) {
  return p == Precision::fp8 && o.emulate_fp8 ? DType::f32 : activation_dtype(p);
}

HostBatch sample_range(const HostBatch& all, std::int64_t begin, std::int64_t end) {
  HostBatch out;
  out.batch = static_cast<int>(end - begin);
  out.seq = all.seq;
  out.blank_pixels = all.blank_pixels;
  auto cut = [&](const auto& v, auto& dst) {
    const std::size_t per = v.size() / static_cast<std::size_t>(all.batch);
    dst.assign(v.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(begin)),
               v.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(end)));
  };
  cut(all.ids, out.ids);
  cut(all.targets, out.targets);
  cut(all.pixels, out.pixels);
  return out;
}

HostBatch example_batch(const ModelSpec& m, int micro_batch, int seq) {
  const ModelIo io = model_io(m, seq);
  HostBatch h;
  h.batch = micro_batch;
  h.seq = static_cast<int>(io.tokens_per_sample);
  h.blank_pixels = io.pixels_per_sample() > 0;
  for (std::int64_t i = 0; i < micro_batch * io.ids_per_sample; ++i)
    h.ids.push_back(static_cast<std::int32_t>(i * 31 % m.vocab));
  if (io.targets_are_ids) {
    h.targets = h.ids;
  } else {
    for (std::int64_t i = 0; i < micro_batch * io.targets_per_sample; ++i)
      h.targets.push_back(static_cast<std::int32_t>(i * 17 % io.target_range));
  }
  return h;
}

Status StepEngine::supports(const Plan& p, const StepOptions& o) {
  // Dropout masks are drawn per row of a contiguous block (BlockContext::dropout); a context rank's rows are
  // two chunks of each sequence, so its masks would not be the single-rank run's.
  if (p.cp > 1 && o.dropout > 0)
    return make_error("dropout {} is not implemented under context parallelism (cp {}); use --dropout 0 or cp 1",
                      o.dropout, p.cp);
  return ok_status();
}

const Group& StepEngine::replicas() const {
  return *mesh_.group_of(plan_.cp > 1 ? GroupKind::data_context : GroupKind::data, b_.rank());
}

Status check_step_options(const StepOptions& o) {
  MT_TRY(check_real("dropout (--dropout)", o.dropout, kDropoutRange));
  MT_TRY(check_real("weight decay (--weight-decay)", o.optimizer.weight_decay, kWeightDecayRange));
  MT_TRY(check_real("AdamW beta1 (--adam-beta1)", o.optimizer.beta1, kAdamBetaRange));
  MT_TRY(check_real("AdamW beta2 (--adam-beta2)", o.optimizer.beta2, kAdamBetaRange));
  MT_TRY(check_real("AdamW epsilon (--adam-eps)", o.optimizer.eps, kAdamEpsRange));
  MT_TRY(check_real("gradient clip norm (--grad-clip, 0: off)", o.optimizer.max_grad_norm, kGradClipRange));
  return ok_status();
}

StepEngine::~StepEngine() = default;

StepEngine::StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options)
    : b_(b), m_(m), io_(model_io(m)), plan_(p), mesh_(mesh), options_(options),
      coord_(mesh.coord_of(b.rank())) {
  if (Status s = check_and_build_pipeline(); !s) {
    setup_error_ = s.error();
    return;
  }
  compute_ = b.current_stream();
  comm_ = b.create_stream("data-parallel");
  if (p.moe_a2a_overlap) expert_ = b.create_stream("expert-parallel");
  if (p.offload != Offload::none)
    offload_ = {b.create_stream("offload-d2h"), b.create_stream("offload-host"), b.create_stream("offload-h2d")};
  const TensorParallel tp{*mesh.group_of(GroupKind::tensor, b.rank()), coord_.tp, p.tp};
  const ChunkOptions shared = chunk_options();
  moe_layers_ = m.moe_layer_count();
  for (int c = 0; c < p.vpp; ++c) chunks_.push_back(build_chunk(c, tp, shared));
  if (p.zero >= 3 && p.prefetch_across_chunks) map_next_passes();
  // The loss and the squared norm side by side, so that the step reads both back at once: one wait for the
  // device per step. Each half keeps its own collectives.
  step_stats_ = b.empty(Shape{2});
  loss_total_ = step_stats_.slice(0, 1);
  grad_sumsq_ = step_stats_.slice(1, 1);
}

Status StepEngine::check_and_build_pipeline() {
  MT_TRY(supports(plan_, options_));
  if (emulates_fp8()) MT_TRY(check_fp8_emulation(m_, plan_));
  MT_ASSIGN(PipelineExecutor pipeline, PipelineExecutor::create(plan_, mesh_, b_.rank()));
  pipeline_ = std::make_unique<PipelineExecutor>(std::move(pipeline));
  return ok_status();
}

ChunkOptions StepEngine::chunk_options() const {
  ChunkOptions o{plan_.recompute, options_.dropout, {}};
  o.recompute_modules = effective_recompute_modules(plan_);
  // ZeRO-2 frees gradients between uses, ZeRO-3 parameters too (gradient_buckets.h, parameter_gather.h).
  o.storage.persistent_grads = plan_.zero < 2;
  o.storage.persistent_values = plan_.zero < 3;
  o.storage.value_dtype = value_dtype();
  o.storage.grad_dtype = gradient_dtype(plan_);
  o.sequence_parallel = plan_.sequence_parallel;
  o.tp_comm_overlap = plan_.tp_comm_overlap;
  // The expert mesh (engine/plan/mesh.h): used by the MoE layers and their gradients.
  const int rank = b_.rank();
  const Group& ep = *mesh_.group_of(GroupKind::expert, rank);
  const Group& etp = *mesh_.group_of(GroupKind::expert_tensor, rank);
  o.expert = ExpertParallel{ep, ep.index_of(rank), ep.size(), etp, etp.index_of(rank), etp.size()};
  const Group& context = *mesh_.group_of(GroupKind::context, rank);
  o.context = ContextParallel{context, context.index_of(rank), context.size(), plan_.cp_comm};
  o.routing = options_.moe_routing;
  o.expert_stream = expert_;
  return o;
}

std::unique_ptr<StepEngine::Chunk> StepEngine::build_chunk(int c, const TensorParallel& tp,
                                                           const ChunkOptions& shared) {
  auto chunk = std::make_unique<Chunk>();
  chunk->virtual_stage = c * plan_.pp + coord_.pp;
  const int vs = chunk->virtual_stage;
  // The plan's split: even, or Megatron-Core's given first/last stage layer counts (models/parameters.h).
  const LayerRange range = virtual_stage_layers(m_, plan_.stage_split(), vs);
  // A segment holds the model's first (last) block only if the plan says so (engine/plan/plan.h).
  const ChunkLayers layers{range.begin, range.end, vs == 0 && plan_.embedding,
                           vs == plan_.pp * plan_.vpp - 1 && plan_.head};
  chunk->model = std::make_unique<ModelChunk>(b_, m_, layers, tp, shared);
  ParameterStore& params = chunk->model->parameters();
  // FP8 operands are cast where the cpu emulates them exactly and where the sim costs them (a
  // backend of shapes only); cuda has no FP8 GEMMs to feed (the CLI refuses fp8 there).
  if (emulates_fp8() || (plan_.precision == Precision::fp8 && !b_.holds_values())) {
    std::vector<ParamInfo> infos;
    for (const ParamSlot& slot : params.slots()) infos.push_back(slot.info);
    chunk->fp8 = std::make_unique<Fp8Scaling>(b_, infos, plan_.fp8_recipe, kDefaultAmaxHistory, plan_.zero < 3);
    chunk->model->use_fp8(chunk->fp8.get());
  }
  add_buckets(*chunk, c);
  if (plan_.zero >= 3) {
    std::vector<int> order;
    if (layers.embedding) order.push_back(-1);
    for (int l = layers.first; l < layers.last; ++l) order.push_back(l);
    if (layers.head) order.push_back(m_.layers);
    chunk->gather = std::make_unique<ParameterGather>(b_, params, *chunk->buckets, std::move(order), compute_, comm_,
                                                      plan_.offload == Offload::params);
  }
  // Counter-based init: every shard and the tied copy draw the single-rank values.
  if (options_.initialize_parameters) {
    if (chunk->gather) chunk->gather->initialize(options_.seed);
    else params.initialize(options_.seed);
  }
  set_layer_hooks(*chunk);
  add_optimizer(*chunk);
  return chunk;
}

void StepEngine::add_buckets(Chunk& chunk, int c) {
  const std::int64_t elements = plan_.megatron_buckets ? megatron_bucket_elements(plan_.dp, coord_.pp, c)
                                                       : static_cast<std::int64_t>(grad_bucket_elements(plan_));
  // Both pipeline ends hold the tied embedding; their gradients are summed before the dp reduction.
  const bool defer_embedding = m_.tied_embeddings && plan_.pp > 1;
  chunk.buckets = std::make_unique<GradientBuckets>(
      b_, m_, chunk.model->parameters(), chunk.model->layers().head, replicas(), plan_.zero, elements,
      defer_embedding, compute_, comm_, *mesh_.group_of(GroupKind::expert_data, b_.rank()),
      BucketCompression{plan_.grad_compression, plan_.grad_compression_warmup, plan_.error_feedback},
      plan_.zero_reduce_once ? UnitReduce::once_per_step : UnitReduce::per_microbatch, plan_.fp8_param_gather);
}

void StepEngine::set_layer_hooks(Chunk& chunk) {
  GradientBuckets* buckets = chunk.buckets.get();
  ParameterGather* gather = chunk.gather.get();
  LayerHooks hooks;
  hooks.before_backward = [buckets, gather](int layer) {
    if (gather) gather->before(layer, true);
    buckets->before_backward(layer);
  };
  hooks.after_backward = [buckets, gather](int layer) {
    buckets->after_backward(layer);
    if (gather) gather->after(layer, true);
  };
  Chunk* self = &chunk;
  if (gather || plan_.overlap_update)
    hooks.before_forward = [this, self, gather](int layer) {
      wait_for_update(*self, layer);
      if (gather) gather->before(layer, false);
    };
  if (gather) hooks.after_forward = [gather](int layer) { gather->after(layer, false); };
  chunk.model->set_hooks(std::move(hooks));
}

void StepEngine::add_optimizer(Chunk& chunk) {
  chunk.adam = std::make_unique<ShardedAdamW>(b_, chunk.model->parameters(), *chunk.buckets, chunk.gather.get(),
                                              comm_, plan_.offload, offload_);
  chunk.updated.resize(chunk.buckets->buckets().size());
  // Offloaded, each bucket's gradients go to the host as soon as they are reduced, under backward.
  if (plan_.offload != Offload::none)
    chunk.buckets->notify_reduced([adam = chunk.adam.get()](std::size_t i) { adam->offload_reduced(i); });
  // Without clipping a bucket's update needs nothing but its own reduced gradients.
  Chunk* self = &chunk;
  if (plan_.overlap_update)
    chunk.buckets->overlap_updates(options_.optimizer.max_grad_norm > 0 ? std::function<void(std::size_t)>()
                                                                        : [this, self](std::size_t i) {
                                                                            update_bucket(*self, i, Tensor());
                                                                          });
}

void StepEngine::map_next_passes() {
  using K = schedule::Action;
  const K* prev = nullptr;
  for (const K& a : pipeline_->schedule().ranks[static_cast<std::size_t>(pipeline_->stage())]) {
    if (a.kind != K::forward && a.kind != K::backward) continue;  // a W pass reads no parameters
    if (prev) next_pass_[{prev->kind == K::backward, prev->chunk, prev->microbatch}] = {a.chunk, a.kind == K::backward};
    prev = &a;
  }
}

namespace {

// A context rank's tokens of every sequence of `all` (B·T, sample-major): its two chunks (models/context_parallel.h).
std::vector<std::int32_t> context_tokens(const std::vector<std::int32_t>& all, int batch, int seq, int cp, int rank) {
  const std::vector<std::int32_t> positions = context_positions(seq, cp, rank);
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(batch) * positions.size());
  for (int b = 0; b < batch; ++b)
    for (const std::int32_t p : positions) out.push_back(all[static_cast<std::size_t>(b) * seq + p]);
  return out;
}

}  // namespace

MicroBatch StepEngine::upload(const HostBatch& full, std::uint64_t dropout_seed) {
  MicroBatch mb;
  HostBatch local;
  const HostBatch& h = plan_.cp > 1 ? local : full;
  if (plan_.cp > 1) {
    local.batch = full.batch, local.seq = full.seq / plan_.cp;
    if (!full.ids.empty()) local.ids = context_tokens(full.ids, full.batch, full.seq, plan_.cp, coord_.cp);
    if (!full.targets.empty())
      local.targets = context_tokens(full.targets, full.batch, full.seq, plan_.cp, coord_.cp);
  }
  if (!h.ids.empty()) {
    mb.ids = b_.empty(Shape{static_cast<std::int64_t>(h.ids.size())}, DType::i32);
    b_.write(mb.ids, h.ids);
  }
  if (io_.image_side > 0 && (h.blank_pixels || !h.pixels.empty())) {
    mb.pixels = b_.empty(Shape{h.batch, io_.image_side, io_.image_side, io_.channels}, value_dtype());
    if (h.blank_pixels) b_.write(mb.pixels, std::vector<float>(static_cast<std::size_t>(mb.pixels.numel()), 0.f));
    else b_.write(mb.pixels, h.pixels);
  }
  // A segment without the head gets no targets (engine/segments/).
  if (!h.targets.empty()) {
    mb.targets = b_.empty(Shape{static_cast<std::int64_t>(h.targets.size())}, DType::i32);
    b_.write(mb.targets, h.targets);
  }
  mb.batch = h.batch;
  mb.seq = h.seq;
  mb.dropout_seed = dropout_seed;
  return mb;
}

std::function<Shape(int, int, bool)> StepEngine::boundaries(const std::vector<MicroBatch>& mbs) const {
  return [this, &mbs](int c, int j, bool output) {
    const MicroBatch& mb = mbs[static_cast<std::size_t>(j)];
    return chunks_[static_cast<std::size_t>(c)]->model->boundary_shape(mb.batch, mb.seq, output);
  };
}

Status StepEngine::check_batch(const HostBatch& h) const {
  if (h.batch <= 0) return make_error("a micro-batch needs at least one sample, got {}", h.batch);
  const ModelIo io = model_io(m_, h.seq);
  const std::size_t targets = static_cast<std::size_t>(h.batch * io.targets_per_sample);
  // A plan's segment reads the samples only if it holds the embedding, the targets only if it holds the head.
  if (plan_.head && h.targets.size() != targets)
    return make_error("a micro-batch of {} samples needs {} targets, got {}", h.batch, targets, h.targets.size());
  if (!plan_.embedding) return check_sequence_split(h);
  if (io.tokens_fixed_by_model && h.seq != io.tokens_per_sample)
    return make_error("model '{}' reads {} ({} tokens each): a micro-batch has {} tokens per sample", m_.name,
                      io.describe(), io.tokens_per_sample, h.seq);
  const std::size_t pixels = static_cast<std::size_t>(h.batch * io.pixels_per_sample());
  if (!h.blank_pixels && h.pixels.size() != pixels)
    return make_error("model '{}' reads {} ({} tokens each): a micro-batch of {} needs {} pixels, got {}", m_.name,
                      io.describe(), io.tokens_per_sample, h.batch, pixels, h.pixels.size());
  const std::size_t ids = static_cast<std::size_t>(h.batch * io.ids_per_sample);
  if (h.ids.size() != ids)
    return make_error("model '{}' reads {}: a micro-batch of {} samples needs {} ids, got {}", m_.name,
                      io.describe(), h.batch, ids, h.ids.size());
  return check_sequence_split(h);
}

Status StepEngine::check_sequence_split(const HostBatch& h) const {
  if (!plan_.sequence_parallel) return ok_status();
  for (const auto& block : model_blocks(m_)) {
    const BlockIo io = block->io(h.seq);
    for (const std::int64_t tokens : {io.tokens_in, io.tokens_out}) {
      const std::int64_t rows = h.batch * tokens;
      if (io.width_in > 0 && io.width_out > 0 && rows % plan_.tp != 0)
        return make_error("sequence parallelism splits the {}·{} rows of a micro-batch at layer {} over tp {}, "
                          "which does not divide them; pick a micro-batch (or sequence length) whose rows tp "
                          "divides at every layer",
                          h.batch, tokens, block->layer(), plan_.tp);
    }
  }
  return ok_status();
}

void StepEngine::add_expert_sumsq() {
  if (!io_.routes_to_experts) return;
  Tensor sumsq = b_.empty(Shape{1});
  b_.fill(sumsq, 0.f);
  for (auto& c : chunks_) c->adam->accumulate_sumsq(sumsq, [](const ParamSlot& s) { return s.info.expert; });
  // ZeRO shards each expert over its replicas; the replicas of one edp index
  // hold every expert shard once; the stages hold the layers.
  if (plan_.zero >= 1) b_.all_reduce(sumsq, *mesh_.group_of(GroupKind::expert_data, b_.rank()), ReduceOp::sum);
  b_.all_reduce(sumsq, *mesh_.group_of(GroupKind::expert_model, b_.rank()), ReduceOp::sum);
  b_.all_reduce(sumsq, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);
  b_.add(grad_sumsq_, sumsq, grad_sumsq_);
}

bool StepEngine::counts_in_norm(const Chunk& c, const ParamSlot& slot) const {
  if (slot.info.expert) return false;  // add_expert_sumsq counts them
  // Replicated over tp: identical on every tp rank, counted on the first.
  if (slot.info.split == TpSplit::replicated && coord_.tp != 0) return false;
  // The last stage's copy of the tied embedding has the same (summed) gradient as the first's.
  if (slot.info.name == "embed.tokens" && !c.model->layers().embedding) return false;
  return true;
}

Status StepEngine::all_reduce_tied_embedding() {
  if (!m_.tied_embeddings || plan_.pp == 1) return ok_status();
  const Group* g = mesh_.group_of(GroupKind::embedding, b_.rank());
  if (g == nullptr || g->size() == 1) return ok_status();
  Chunk& c = coord_.pp == 0 ? *chunks_.front() : *chunks_.back();
  Tensor grad = c.model->parameters()["embed.tokens"].grad;
  b_.wait(comm_, b_.record(compute_));
  StreamScope on_comm(b_, comm_);
  b_.all_reduce(grad, *g, ReduceOp::sum);
  return ok_status();
}

Status StepEngine::begin_step(const std::vector<HostBatch>& microbatches, std::int64_t step, float lr) {
  if (setup_error_) return *setup_error_;
  update_op_ = adamw_op(lr, step);
  const int m = plan_.microbatches();
  if (static_cast<int>(microbatches.size()) != m)
    return make_error("step {}: got {} micro-batches, the plan runs {} per data-parallel replica", step,
                      microbatches.size(), m);
  for (auto& c : chunks_) {
    if (!plan_.overlap_update) c->model->parameters().zero_grads();  // else the buckets zero them
    c->model->moe_statistics().clear(b_);
    c->buckets->begin_step(step);
    c->adam->begin_step();
    c->saved.clear();
    c->saved.resize(static_cast<std::size_t>(m));
    c->weights.clear();
    c->weights.resize(static_cast<std::size_t>(m));
    if (c->fp8) c->fp8->begin_step();
  }
  b_.fill(loss_total_, 0.f);
  const int seq = microbatches.front().seq;
  for (const HostBatch& h : microbatches) MT_TRY(check_batch(h).context(fmt::format("step {}", step)));
  const double tokens =
      static_cast<double>(plan_.effective_global_batch()) * static_cast<double>(loss_terms_per_sample(m_, seq));
  // Every target (token or image) of the global batch weighs 1/tokens, so
  // summing over replicas gives the mean's gradient.
  loss_terms_ = tokens;
  loss_scale_ = static_cast<float>(1.0 / tokens);
  mbs_.clear();
  for (int i = 0; i < m; ++i) {
    // Seeds follow the global micro-batch index, so dropout does not depend on the plan.
    const std::uint64_t global = static_cast<std::uint64_t>(coord_.dp) * m + i;
    const std::uint64_t seed = mix64(options_.seed ^ mix64(static_cast<std::uint64_t>(step) * 1000003u + global));
    mbs_.push_back(upload(microbatches[static_cast<std::size_t>(i)], seed));
  }
  return ok_status();
}

void StepEngine::name_next_pass(int c, int j, bool backward, bool training) {
  ParameterGather* gather = chunks_[static_cast<std::size_t>(c)]->gather.get();
  if (!gather) return;
  auto it = training ? next_pass_.find({backward, c, j}) : next_pass_.end();
  if (it == next_pass_.end()) {
    gather->set_next_pass(nullptr, false);
    return;
  }
  gather->set_next_pass(chunks_[static_cast<std::size_t>(it->second.first)]->gather.get(), it->second.second);
}

Phased<Tensor> StepEngine::forward_pass(int c, int j, Tensor in, bool training) {
  const int last = plan_.pp * plan_.vpp - 1;
  Chunk& ch = *chunks_[static_cast<std::size_t>(c)];
  const MicroBatch& mb = mbs_[static_cast<std::size_t>(j)];
  Tensor input = in;
  // A segment that does not start the model reads its input from the segment before.
  if (boundary_ && ch.virtual_stage == 0 && !ch.model->layers().embedding)
    input = boundary_->input(j, ch.model->boundary_shape(mb.batch, mb.seq, false), value_dtype());
  name_next_pass(c, j, false, training);
  SavedActivations scratch;  // evaluation keeps nothing
  Phased<Tensor> pass = ch.model->forward_phased(mb, input, training ? ch.saved[static_cast<std::size_t>(j)] : scratch);
  while (pass.resume()) co_yield Pause{};
  Tensor out = pass.result();
  if (ch.model->layers().head) {
    b_.axpy(1.f, out, loss_total_);
    co_return Tensor();
  }
  if (boundary_ && ch.virtual_stage == last) boundary_->output(j, out);
  co_return out;
}

Phased<Tensor> StepEngine::backward_pass(int c, int j, Tensor dout) {
  const int last = plan_.pp * plan_.vpp - 1, m = static_cast<int>(mbs_.size());
  Chunk& ch = *chunks_[static_cast<std::size_t>(c)];
  const MicroBatch& mb = mbs_[static_cast<std::size_t>(j)];
  // Micro-batches leave each chunk's backward in order: the last one completes its gradients.
  // Unarmed, the buckets wait for finish(), after the schedule (GradSync::after_backward, and
  // zero-bubble schedules, whose W passes complete the gradients after the backwards).
  const bool split = plan_.schedule == ScheduleKind::zb_h1;
  if (j == m - 1 && plan_.grad_sync == GradSync::overlap && !split) ch.buckets->arm();
  ch.model->defer_weight_gradients(split ? &ch.weights[static_cast<std::size_t>(j)] : nullptr);
  name_next_pass(c, j, true, true);
  Tensor d = dout;
  if (boundary_ && ch.virtual_stage == last && !ch.model->layers().head)
    d = boundary_->output_grad(j, ch.model->boundary_shape(mb.batch, mb.seq, true), value_dtype());
  Phased<Tensor> pass = ch.model->backward_phased(mb, ch.saved[static_cast<std::size_t>(j)], d, loss_scale_);
  while (pass.resume()) co_yield Pause{};
  Tensor din = pass.result();
  ch.model->defer_weight_gradients(nullptr);
  if (boundary_ && ch.virtual_stage == 0 && !ch.model->layers().embedding) boundary_->input_grad(j, din);
  co_return din;
}

PipelineCompute StepEngine::compute(bool training) {
  auto forward = [this, training](int c, int j, const Tensor& in) { return forward_pass(c, j, in, training).run(); };
  auto backward = [this](int c, int j, const Tensor& dout) { return backward_pass(c, j, dout).run(); };
  auto weight = [this](int c, int j) {
    auto& work = chunks_[static_cast<std::size_t>(c)]->weights[static_cast<std::size_t>(j)];
    for (auto& w : work) w();
    work.clear();  // frees the inputs and output gradients they kept
  };
  PipelineCompute out{forward, {}, {}, boundaries(mbs_), {}};
  if (training) out.backward = backward, out.weight = weight;
  // EP all-to-all overlap (Megatron-Core's combined 1F1B): the backward's phases first, then the
  // forward's, alternately, so that each all-to-all on the expert stream runs under the other
  // pass's compute.
  if (training && plan_.moe_a2a_overlap)
    out.forward_backward = [this](int cf, int jf, const Tensor& in, int cb, int jb, const Tensor& dout) {
      Phased<Tensor> f = forward_pass(cf, jf, in, true);
      Phased<Tensor> g = backward_pass(cb, jb, dout);
      alternate(g, f);
      return std::pair<Tensor, Tensor>{f.result(), g.result()};
    };
  return out;
}

void StepEngine::run(Phase phase) {
  const PipelineCompute c = compute(true);
  const DType act = value_dtype();
  switch (phase) {
    case Phase::all: pipeline_->run(b_, c, act); break;
    case Phase::forward: pipeline_->run(b_, c, act, PipelineExecutor::Part::before_backward); break;
    case Phase::backward: pipeline_->run(b_, c, act, PipelineExecutor::Part::from_backward); break;
  }
}

Status StepEngine::finish_gradients() {
  MT_TRY(all_reduce_tied_embedding());
  for (auto& c : chunks_) c->buckets->finish();
  return ok_status();
}

Status StepEngine::reduce_statistics(std::int64_t step) {
  MT_TRY(finish_gradients());
  // Overlapped, the gradients are reduced on the data-parallel stream and stay there; the loss
  // joins them, so that its collectives over the data-parallel group keep one stream's order.
  if (plan_.overlap_update) b_.wait(comm_, b_.record(compute_));
  StreamScope on(b_, update_stream());
  reduce_grad_norm();
  reduce_loss();
  // Delayed scaling: step t's amax, over every rank holding part of each tensor, set step t+1's FP8
  // scales. Current scaling keeps nothing across steps.
  const std::vector<Fp8Scaling*> fp8 = fp8_chunks();
  const Group* amax_groups[] = {mesh_.group_of(GroupKind::tensor, b_.rank()), &replicas()};
  if (!fp8.empty() && plan_.fp8_recipe == Fp8Recipe::delayed)
    MT_TRY(fold_fp8_amax(b_, fp8, amax_groups).context(fmt::format("step {}", step)));
  return ok_status();
}

void StepEngine::reduce_grad_norm() {
  b_.fill(grad_sumsq_, 0.f);
  for (auto& c : chunks_)
    c->adam->accumulate_sumsq(grad_sumsq_, [&](const ParamSlot& s) { return counts_in_norm(*c, s); });
  // Without ZeRO every replica holds the same reduced gradients: sum over one replica only.
  if (plan_.zero >= 1) b_.all_reduce(grad_sumsq_, replicas(), ReduceOp::sum);
  b_.all_reduce(grad_sumsq_, *mesh_.group_of(GroupKind::model_parallel, b_.rank()), ReduceOp::sum);
  add_expert_sumsq();
}

void StepEngine::reduce_loss() {
  // The loss lives on the last stage (the same on each of its tp ranks; a share of it on each context rank).
  b_.all_reduce(loss_total_, replicas(), ReduceOp::sum);
  b_.all_reduce(loss_total_, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);
}

AdamWOp StepEngine::adamw_op(float lr, std::int64_t step) const {
  const OptimizerOptions& o = options_.optimizer;
  AdamWOp op{lr, o.beta1, o.beta2, o.eps, 0.f, step};
  // 1-bit gradients after a warm-up are 1-bit Adam: the variance freezes when compression starts
  // (Tang et al. 2021), so that error feedback compensates what a linear update loses.
  const int warmup = plan_.grad_compression_warmup;
  if (plan_.grad_compression == GradCompression::one_bit && warmup > 0 && step > warmup) op.variance_frozen_at = warmup;
  return op;
}

void StepEngine::finish_update(const Tensor& coef) {
  if (plan_.overlap_update) return finish_overlapped_update(coef);
  for (auto& c : chunks_) c->adam->update(update_op_, weight_decay(), coef);
  for (auto& c : chunks_) c->saved.clear();
}

void StepEngine::update_bucket(Chunk& c, std::size_t i, const Tensor& coef) {
  // The bucket's reduction (and the norm, for `coef`) came before on this stream.
  StreamScope on_comm(b_, comm_);
  c.adam->update_bucket(i, update_op_, weight_decay(), coef);
  if (!c.adam->gathers()) c.updated[i] = b_.record(comm_);
}

void StepEngine::finish_overlapped_update(const Tensor& coef) {
  StreamScope on_comm(b_, comm_);
  // Forward order, so that the next forward's first layers wait the least.
  for (auto& c : chunks_)
    for (std::size_t i = 0; i < c->updated.size(); ++i) {
      if (coef.defined()) update_bucket(*c, i, coef);
      if (!c->adam->gathers()) continue;
      c->adam->gather_bucket(i);
      c->updated[i] = b_.record(comm_);
    }
  for (auto& c : chunks_) c->saved.clear();
}

void StepEngine::wait_for_update(Chunk& c, int layer) {
  const std::vector<Bucket>& buckets = c.buckets->buckets();
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (!c.updated[i].valid() || !std::binary_search(buckets[i].uses.begin(), buckets[i].uses.end(), layer)) continue;
    b_.wait(compute_, c.updated[i]);
    c.updated[i] = Event{};
  }
}

void StepEngine::settle() {
  if (!plan_.overlap_update) return;
  b_.wait(compute_, b_.record(comm_));
  for (auto& c : chunks_) std::fill(c->updated.begin(), c->updated.end(), Event{});
}

Status check_finite(const StepResult& r, std::int64_t step) {
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) return ok_status();
  return make_error("step {}: the loss is {} (gradient norm {}); stopping before the update, so the "
                    "parameters are those of step {}; lower --lr or check the data",
                    step, r.loss, r.grad_norm, step - 1);
}

Result<MoeStepStats> StepEngine::moe_statistics() {
  // [Σ balance, Σ router z, assignments, dropped, tokens (MoE layer × expert)], summed like the loss.
  const std::int64_t E = m_.experts, L = moe_layers_;
  std::vector<float> host(static_cast<std::size_t>(4 + L * E), 0.f);
  Tensor sums = b_.empty(Shape{static_cast<std::int64_t>(host.size())});
  for (auto& c : chunks_) {
    MoeStatistics& st = c->model->moe_statistics();
    host[2] += static_cast<float>(st.assignments);
    host[3] += static_cast<float>(st.dropped);
    for (const auto& [layer, tokens] : st.tokens)
      for (std::int64_t e = 0; e < E; ++e)
        host[static_cast<std::size_t>(4 + layer * E + e)] += static_cast<float>(tokens[static_cast<std::size_t>(e)]);
  }
  b_.write(sums, host);
  for (auto& c : chunks_) {
    Tensor losses = sums.slice(0, 2);
    b_.axpy(1.f, c->model->moe_statistics().losses, losses);
  }
  b_.all_reduce(sums, *mesh_.group_of(GroupKind::data, b_.rank()), ReduceOp::sum);
  b_.all_reduce(sums, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);
  MT_TRY(b_.read(sums, host));
  MoeStepStats st;
  const double micro_batches = static_cast<double>(plan_.effective_global_batch()) / plan_.micro_batch;
  st.aux_loss = m_.aux_loss_coeff * host[0] / micro_batches;
  st.z_loss = m_.z_loss_coeff * host[1] / micro_batches;
  st.balance = host[0] / (micro_batches * static_cast<double>(L));
  st.router_z = host[1] / (micro_batches * static_cast<double>(L));
  st.dropped_fraction = host[2] > 0 ? host[3] / host[2] : 0.0;
  for (std::int64_t l = 0; l < L; ++l) {
    std::vector<double> tokens(host.begin() + 4 + l * E, host.begin() + 4 + (l + 1) * E);
    double max = 0, sum = 0;
    for (double t : tokens) max = std::max(max, t), sum += t;
    const double ratio = sum > 0 ? max / (sum / static_cast<double>(E)) : 0.0;
    st.load_max_over_mean = std::max(st.load_max_over_mean, ratio);
    st.load_mean_max_over_mean += ratio / static_cast<double>(L);
    st.tokens_per_expert.push_back(std::move(tokens));
  }
  return st;
}

Status StepEngine::begin_evaluation(const std::vector<HostBatch>& batches) {
  if (setup_error_) return *setup_error_;
  settle();
  b_.fill(loss_total_, 0.f);
  // [Σ loss, targets, correct] of the last stage, summed over the pipeline (others hold 0) and the replicas.
  eval_stats_ = b_.empty(Shape{3});
  Tensor correct = eval_stats_.slice(2, 1);
  double targets = 0;
  mbs_.clear();
  for (const HostBatch& h : batches) {
    MT_TRY(check_batch(h));
    mbs_.push_back(upload(h, 0));
    mbs_.back().correct = correct;
    targets += static_cast<double>(h.targets.size());
  }
  // The targets are counted once per replica (a context rank sees a share of each sequence's).
  const bool last = plan_.head && coord_.pp == plan_.pp - 1 && coord_.cp == 0;
  const float init[3] = {0.f, last ? static_cast<float>(targets) : 0.f, 0.f};
  b_.write(eval_stats_, init);
  return ok_status();
}

void StepEngine::run_evaluation() {
  pipeline_->run_forward(b_, static_cast<int>(mbs_.size()), compute(false), value_dtype());
}

const Tensor& StepEngine::evaluation_stats() {
  Tensor loss = eval_stats_.slice(0, 1), correct = eval_stats_.slice(2, 1);
  b_.axpy(1.f, loss_total_, loss);
  // Every tp rank of the last stage counted the same hits: keep one count per replica.
  if (coord_.tp != 0) b_.fill(correct, 0.f);
  b_.all_reduce(eval_stats_, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);
  b_.all_reduce(eval_stats_, replicas(), ReduceOp::sum);
  return eval_stats_;
}

std::vector<Fp8Scaling*> StepEngine::fp8_chunks() const {
  std::vector<Fp8Scaling*> out;
  for (const auto& c : chunks_)
    if (c->fp8) out.push_back(c->fp8.get());
  return out;
}

}  // namespace meshtrain
