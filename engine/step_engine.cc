#include "engine/step_engine.h"

#include <cmath>

#include "engine/parallel/gradient_buckets.h"
#include "engine/parallel/parameter_gather.h"
#include "engine/parallel/sharded_optimizer.h"
#include "models/parameters.h"
#include "models/init.h"

namespace meshtrain {

namespace {

// Mixed precision: 16-bit working weights and activations (fp32 masters, gradients and AdamW state).
DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
    case Precision::fp32: return DType::f32;
  }
  return DType::f32;
}

}  // namespace

HostBatch example_batch(const ModelSpec& m, int micro_batch, int seq) {
  HostBatch h;
  h.batch = micro_batch;
  h.seq = m.vision() ? m.seq_len : seq;
  if (m.vqa()) {
    // Blank images, a question of ids and an answer word each.
    h.pixels.assign(static_cast<std::size_t>(micro_batch) * m.image_size * m.image_size * m.channels, 0.f);
    for (int i = 0; i < micro_batch * m.question_len; ++i) h.ids.push_back(i * 31 % m.vocab);
    for (int i = 0; i < micro_batch; ++i) h.targets.push_back(i * 17 % m.vocab);
    return h;
  }
  if (m.vision()) {
    h.pixels.assign(static_cast<std::size_t>(micro_batch) * m.image_size * m.image_size * m.channels, 0.f);
    for (int i = 0; i < micro_batch; ++i) h.targets.push_back(i % m.classes);
    return h;
  }
  for (int i = 0; i < micro_batch * seq; ++i) h.ids.push_back(i * 31 % m.vocab);
  h.targets = h.ids;
  return h;
}

struct StepEngine::Chunk {
  int virtual_stage = 0;
  std::unique_ptr<ModelChunk> model;
  std::unique_ptr<GradientBuckets> buckets;
  std::unique_ptr<ParameterGather> gather;  // ZeRO-3 only
  std::unique_ptr<ShardedAdamW> adam;
  std::vector<SavedActivations> saved;  // by micro-batch, between its forward and backward
};

Status StepEngine::supports(const Plan& p) {
  if (p.cp != 1) return make_error("context parallelism (cp {}) is not implemented by the step engine; use cp 1", p.cp);
  if (p.ep != 1) return make_error("expert parallelism (ep {}) is not implemented by the step engine; use ep 1", p.ep);
  return ok_status();
}

StepEngine::~StepEngine() = default;

StepEngine::StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options)
    : b_(b), m_(m), plan_(p), mesh_(mesh), options_(options), coord_(mesh.coord_of(b.rank())) {
  if (Status s = supports(p); !s) {
    setup_error_ = s.error();
    return;
  }
  auto pipeline = PipelineExecutor::create(p, mesh, b.rank());
  if (!pipeline) {
    setup_error_ = std::move(pipeline).error();
    return;
  }
  pipeline_ = std::make_unique<PipelineExecutor>(std::move(pipeline).value());
  compute_ = b.current_stream();
  comm_ = b.create_stream("data-parallel");
  const TensorParallel tp{*mesh.group_of(GroupKind::tensor, b.rank()), coord_.tp, p.tp};
  const Group& dp = *mesh.group_of(GroupKind::data, b.rank());
  const int virtual_stages = p.pp * p.vpp;
  // Both pipeline ends hold the tied embedding; their gradients are summed before the dp reduction.
  const bool defer_embedding = m.tied_embeddings && p.pp > 1;
  // Gradients are fp32 (ParameterStore), so a MiB holds 2^18 of them.
  const auto bucket_elements = static_cast<std::int64_t>(p.grad_bucket_mb * (1 << 20) / 4);
  for (int c = 0; c < p.vpp; ++c) {
    auto chunk = std::make_unique<Chunk>();
    chunk->virtual_stage = c * p.pp + coord_.pp;
    const int vs = chunk->virtual_stage;
    // The plan's split: even, or Megatron-Core's given first/last stage layer counts (models/parameters.h).
    const LayerRange range = virtual_stage_layers(m, p.stage_split(), vs);
    const ChunkLayers layers{range.begin, range.end, vs == 0, vs == virtual_stages - 1};
    ChunkOptions chunk_options{p.recompute, options.dropout, {}};
    // ZeRO-2 frees gradients between uses, ZeRO-3 parameters too (gradient_buckets.h, parameter_gather.h).
    chunk_options.storage.persistent_grads = p.zero < 2;
    chunk_options.storage.persistent_values = p.zero < 3;
    chunk_options.storage.value_dtype = activation_dtype(p.precision);
    chunk_options.sequence_parallel = p.sequence_parallel;
    chunk->model = std::make_unique<ModelChunk>(b, m_, layers, tp, chunk_options);
    ParameterStore& params = chunk->model->parameters();
    chunk->buckets = std::make_unique<GradientBuckets>(b, m_, params, layers.head, dp, p.zero, bucket_elements,
                                                       defer_embedding, compute_, comm_);
    if (p.zero >= 3) {
      std::vector<int> order;
      if (layers.embedding) order.push_back(-1);
      for (int l = layers.first; l < layers.last; ++l) order.push_back(l);
      if (layers.head) order.push_back(m.layers);
      chunk->gather = std::make_unique<ParameterGather>(b, params, *chunk->buckets, std::move(order), compute_, comm_);
    }
    // Counter-based init: every shard and the tied copy draw the single-rank values.
    if (options.initialize_parameters) {
      if (chunk->gather) chunk->gather->initialize(options.seed);
      else params.initialize(options.seed);
    }
    GradientBuckets* buckets = chunk->buckets.get();
    ParameterGather* gather = chunk->gather.get();
    LayerHooks hooks;
    hooks.before_backward = [buckets, gather](int layer) {
      if (gather) gather->before(layer, true);
      buckets->before_backward(layer);
    };
    hooks.after_backward = [buckets, gather](int layer) {
      buckets->after_backward(layer);
      if (gather) gather->after(layer, true);
    };
    if (gather) {
      hooks.before_forward = [gather](int layer) { gather->before(layer, false); };
      hooks.after_forward = [gather](int layer) { gather->after(layer, false); };
    }
    chunk->model->set_hooks(std::move(hooks));
    chunk->adam = std::make_unique<ShardedAdamW>(b, params, *chunk->buckets, gather, comm_);
    chunks_.push_back(std::move(chunk));
  }
  loss_total_ = b.empty(Shape{1});
  grad_sumsq_ = b.empty(Shape{1});
  clip_coef_ = b.empty(Shape{1});
}

MicroBatch StepEngine::upload(const HostBatch& h, std::uint64_t dropout_seed) {
  MicroBatch mb;
  if (!h.ids.empty()) {
    mb.ids = b_.empty(Shape{static_cast<std::int64_t>(h.ids.size())}, DType::i32);
    b_.write(mb.ids, h.ids);
  }
  if (m_.vision()) {
    mb.pixels = b_.empty(Shape{h.batch, m_.image_size, m_.image_size, m_.channels}, activation_dtype(plan_.precision));
    b_.write(mb.pixels, h.pixels);
  }
  mb.targets = b_.empty(Shape{static_cast<std::int64_t>(h.targets.size())}, DType::i32);
  b_.write(mb.targets, h.targets);
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
  const std::int64_t n = static_cast<std::int64_t>(h.batch) * h.seq;
  const std::size_t targets = static_cast<std::size_t>(h.batch * loss_terms_per_sample(m_, h.seq));
  if (h.batch <= 0 || h.targets.size() != targets)
    return make_error("a micro-batch of {} samples needs {} targets, got {}", h.batch, targets, h.targets.size());
  if (m_.vision()) {
    const std::size_t pixels = static_cast<std::size_t>(h.batch) * m_.image_size * m_.image_size * m_.channels;
    if (h.seq != m_.seq_len || h.pixels.size() != pixels)
      return make_error("model '{}' reads {}×{}×{} images ({} tokens each): a micro-batch of {} needs {} pixels, "
                        "got {}", m_.name, m_.image_size, m_.image_size, m_.channels, m_.seq_len, h.batch, pixels,
                        h.pixels.size());
    const std::size_t ids = static_cast<std::size_t>(h.batch) * m_.question_len;
    if (m_.vqa() && h.ids.size() != ids)
      return make_error("model '{}' reads questions of {} tokens: a micro-batch of {} needs {} ids, got {}", m_.name,
                        m_.question_len, h.batch, ids, h.ids.size());
  } else if (h.ids.size() != static_cast<std::size_t>(n)) {
    return make_error("a micro-batch of {}·{} tokens needs as many ids, got {}", h.batch, h.seq, h.ids.size());
  }
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

bool StepEngine::counts_in_norm(const Chunk& c, const ParamSlot& slot) const {
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

Result<StepResult> StepEngine::step(const std::vector<HostBatch>& microbatches, float lr, std::int64_t step) {
  if (setup_error_) return *setup_error_;
  const int m = plan_.microbatches();
  if (static_cast<int>(microbatches.size()) != m)
    return make_error("step {}: got {} micro-batches, the plan runs {} per data-parallel replica", step,
                      microbatches.size(), m);
  for (auto& c : chunks_) {
    c->model->parameters().zero_grads();
    c->buckets->begin_step();
    c->saved.clear();
    c->saved.resize(static_cast<std::size_t>(m));
  }
  b_.fill(loss_total_, 0.f);
  const int seq = microbatches.front().seq;
  for (const HostBatch& h : microbatches) MT_TRY(check_batch(h).context(fmt::format("step {}", step)));
  const double tokens =
      static_cast<double>(plan_.effective_global_batch()) * static_cast<double>(loss_terms_per_sample(m_, seq));
  // Every target (token or image) of the global batch weighs 1/tokens, so
  // summing over replicas gives the mean's gradient.
  const float loss_scale = static_cast<float>(1.0 / tokens);
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < m; ++i) {
    // Seeds follow the global micro-batch index, so dropout does not depend on the plan.
    const std::uint64_t global = static_cast<std::uint64_t>(coord_.dp) * m + i;
    const std::uint64_t seed = mix64(options_.seed ^ mix64(static_cast<std::uint64_t>(step) * 1000003u + global));
    mbs.push_back(upload(microbatches[static_cast<std::size_t>(i)], seed));
  }
  const PipelineCompute compute{
      [&](int c, int j, const Tensor& in) {
        Chunk& ch = *chunks_[static_cast<std::size_t>(c)];
        Tensor out = ch.model->forward(mbs[static_cast<std::size_t>(j)], in, ch.saved[static_cast<std::size_t>(j)]);
        if (!ch.model->layers().head) return out;
        b_.axpy(1.f, out, loss_total_);
        return Tensor();
      },
      [&](int c, int j, const Tensor& dout) {
        Chunk& ch = *chunks_[static_cast<std::size_t>(c)];
        // Micro-batches leave each chunk's backward in order: the last one completes its gradients.
        // Unarmed, the buckets wait for finish(), after the schedule (GradSync::after_backward).
        if (j == m - 1 && plan_.grad_sync == GradSync::overlap) ch.buckets->arm();
        return ch.model->backward(mbs[static_cast<std::size_t>(j)], ch.saved[static_cast<std::size_t>(j)], dout,
                                  loss_scale);
      },
      boundaries(mbs)};
  pipeline_->run(b_, compute, activation_dtype(plan_.precision));
  MT_TRY(all_reduce_tied_embedding());
  for (auto& c : chunks_) c->buckets->finish();

  b_.fill(grad_sumsq_, 0.f);
  for (auto& c : chunks_)
    c->adam->accumulate_sumsq(grad_sumsq_, [&](const ParamSlot& s) { return counts_in_norm(*c, s); });
  const Group& dp = *mesh_.group_of(GroupKind::data, b_.rank());
  // Without ZeRO every replica holds the same reduced gradients: sum over one replica only.
  if (plan_.zero >= 1) b_.all_reduce(grad_sumsq_, dp, ReduceOp::sum);
  b_.all_reduce(grad_sumsq_, *mesh_.group_of(GroupKind::model_parallel, b_.rank()), ReduceOp::sum);
  // The loss lives on the last stage (the same on each of its tp ranks).
  b_.all_reduce(loss_total_, dp, ReduceOp::sum);
  b_.all_reduce(loss_total_, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);

  float host[2] = {0, 0};
  MT_TRY(b_.read(loss_total_, std::span<float>(host, 1)).context(fmt::format("step {}", step)));
  MT_TRY(b_.read(grad_sumsq_, std::span<float>(host + 1, 1)).context(fmt::format("step {}", step)));
  StepResult r{host[0] / tokens, std::sqrt(static_cast<double>(host[1]))};
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    return make_error("step {}: the loss is {} (gradient norm {}); stopping before the update, so the "
                      "parameters and the last checkpoint are those of step {}; lower --lr or check the data",
                      step, r.loss, r.grad_norm, step - 1);
  const OptimizerOptions& o = options_.optimizer;
  Tensor coef;
  if (o.max_grad_norm > 0) {
    b_.clip_coefficient(grad_sumsq_, o.max_grad_norm, clip_coef_);
    coef = clip_coef_;
  }
  for (auto& c : chunks_) c->adam->update(AdamWOp{lr, o.beta1, o.beta2, o.eps, 0.f, step}, o.weight_decay, coef);
  for (auto& c : chunks_) c->saved.clear();
  return r;
}

Result<double> StepEngine::evaluate(const std::vector<HostBatch>& batches) {
  MT_ASSIGN(Evaluation e, evaluate_metrics(batches));
  return e.loss;
}

Result<Evaluation> StepEngine::evaluate_metrics(const std::vector<HostBatch>& batches) {
  if (setup_error_) return *setup_error_;
  b_.fill(loss_total_, 0.f);
  // [Σ loss, targets, correct] of the last stage, summed over the pipeline (others hold 0) and the replicas.
  Tensor stats = b_.empty(Shape{3});
  Tensor correct = stats.slice(2, 1);
  double targets = 0;
  std::vector<MicroBatch> mbs;
  for (const HostBatch& h : batches) {
    MT_TRY(check_batch(h));
    mbs.push_back(upload(h, 0));
    mbs.back().correct = correct;
    targets += static_cast<double>(h.targets.size());
  }
  const bool last = coord_.pp == plan_.pp - 1;
  const float init[3] = {0.f, last ? static_cast<float>(targets) : 0.f, 0.f};
  b_.write(stats, init);
  const PipelineCompute compute{[&](int c, int j, const Tensor& in) {
                                  Chunk& ch = *chunks_[static_cast<std::size_t>(c)];
                                  SavedActivations saved;
                                  Tensor out = ch.model->forward(mbs[static_cast<std::size_t>(j)], in, saved);
                                  if (!ch.model->layers().head) return out;
                                  b_.axpy(1.f, out, loss_total_);
                                  return Tensor();
                                },
                                {},
                                boundaries(mbs)};
  pipeline_->run_forward(b_, static_cast<int>(mbs.size()), compute, activation_dtype(plan_.precision));
  Tensor loss = stats.slice(0, 1);
  b_.axpy(1.f, loss_total_, loss);
  // Every tp rank of the last stage counted the same hits: keep one count per replica.
  if (coord_.tp != 0) b_.fill(correct, 0.f);
  b_.all_reduce(stats, *mesh_.group_of(GroupKind::pipeline, b_.rank()), ReduceOp::sum);
  b_.all_reduce(stats, *mesh_.group_of(GroupKind::data, b_.rank()), ReduceOp::sum);
  float host[3] = {0, 0, 0};
  MT_TRY(b_.read(stats, host));
  return Evaluation{static_cast<double>(host[0]) / host[1], static_cast<double>(host[2]) / host[1]};
}

namespace {

const char* const kPrefixes[3] = {"params/", "adam_m/", "adam_v/"};

}  // namespace

Result<std::map<std::string, std::vector<float>>> StepEngine::export_state() {
  if (setup_error_) return *setup_error_;
  std::map<std::string, std::vector<float>> out;
  const Group& tp = *mesh_.group_of(GroupKind::tensor, b_.rank());
  for (auto& c : chunks_) {
    ParameterStore& params = c->model->parameters();
    std::vector<float> flat[3];
    MT_TRY(c->adam->gather_state(flat[0], flat[1], flat[2]));
    for (const ParamSlot& slot : params.slots()) {
      // The tied copy on the last stage equals the first stage's embedding.
      if (slot.info.name == "embed.tokens" && !c->model->layers().embedding) continue;
      const std::int64_t n = slot.numel;
      for (int k = 0; k < 3; ++k) {
        // Every tp rank's shard, then each element to its place in the full tensor.
        Tensor shard = b_.empty(Shape{n}), all = b_.empty(Shape{n * plan_.tp});
        b_.write(shard, std::span<const float>(flat[k]).subspan(static_cast<std::size_t>(slot.offset),
                                                                 static_cast<std::size_t>(n)));
        b_.all_gather(shard, all, tp);
        std::vector<float> host(static_cast<std::size_t>(n * plan_.tp));
        MT_TRY(b_.read(all, host));
        std::vector<float> full(static_cast<std::size_t>(slot.info.numel()));
        for (int t = 0; t < plan_.tp; ++t) {
          const ShardCoord sc{t, plan_.tp, 0, 1};
          for (std::int64_t i = 0; i < n; ++i) {
            const std::int64_t f = full_index(m_, slot.info, sc, i);
            if (f >= 0) full[static_cast<std::size_t>(f)] = host[static_cast<std::size_t>(t * n + i)];
          }
        }
        out.emplace(kPrefixes[k] + slot.info.name, std::move(full));
      }
    }
  }
  if (plan_.pp == 1) return out;
  // Pipeline stages: every parameter from the stage that owns it to every stage.
  const Group& pipe = *mesh_.group_of(GroupKind::pipeline, b_.rank());
  for (const ParamInfo& info : parameter_table(m_)) {
    const int owner = place_layer(m_, info.layer, plan_.stage_split()).stage;
    const int root = mesh_.rank_of({coord_.tp, coord_.cp, coord_.dp, owner});
    for (const char* prefix : kPrefixes) {
      const std::string name = prefix + info.name;
      Tensor t = b_.empty(Shape{info.numel()});
      if (owner == coord_.pp) b_.write(t, out.at(name));
      b_.broadcast(t, pipe, root);
      std::vector<float> host(static_cast<std::size_t>(info.numel()));
      MT_TRY(b_.read(t, host));
      out[name] = std::move(host);
    }
  }
  return out;
}

Status StepEngine::import_state(const std::map<std::string, std::vector<float>>& state) {
  if (setup_error_) return *setup_error_;
  for (auto& c : chunks_) {
    ParameterStore& params = c->model->parameters();
    std::vector<float> flat[3];
    for (auto& f : flat) f.assign(static_cast<std::size_t>(params.numel()), 0.f);
    for (const ParamSlot& slot : params.slots()) {
      const std::int64_t n = slot.numel;
      for (int k = 0; k < 3; ++k) {
        auto it = state.find(kPrefixes[k] + slot.info.name);
        if (it == state.end())
          return make_error("the checkpoint has no tensor '{}{}'", kPrefixes[k], slot.info.name);
        if (static_cast<std::int64_t>(it->second.size()) != slot.info.numel())
          return make_error("checkpoint tensor '{}{}' has {} elements, this model needs {}", kPrefixes[k],
                            slot.info.name, it->second.size(), slot.info.numel());
        std::vector<float> shard(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t f = full_index(m_, slot.info, params.coord(), i);
          shard[static_cast<std::size_t>(i)] = f < 0 ? 0.f : it->second[static_cast<std::size_t>(f)];
        }
        std::copy(shard.begin(), shard.end(), flat[k].begin() + slot.offset);
      }
    }
    c->adam->load_state(flat[0], flat[1], flat[2]);
  }
  return b_.synchronize();
}

}  // namespace meshtrain
