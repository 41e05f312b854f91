#include "engine/step_engine.h"

#include <cmath>

#include "models/init.h"

namespace meshtrain {

StepEngine::StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options)
    : b_(b), m_(m), plan_(p), options_(options) {
  const Coord c = mesh.coord_of(b.rank());
  TensorParallel tp{*mesh.group_of(GroupKind::tensor, b.rank()), c.tp, p.tp};
  ChunkLayers layers{0, m.layers, true, true};
  chunk_ = std::make_unique<GptChunk>(b, m_, layers, tp, ChunkOptions{p.recompute, options.dropout});
  if (options.initialize_parameters) chunk_->parameters().initialize(options.seed);
  const Shape flat{chunk_->parameters().numel()};
  adam_m_ = b.empty(flat);
  adam_v_ = b.empty(flat);
  b.fill(adam_m_, 0.f);
  b.fill(adam_v_, 0.f);
  loss_total_ = b.empty(Shape{1});
  grad_sumsq_ = b.empty(Shape{1});
  clip_coef_ = b.empty(Shape{1});
}

MicroBatch StepEngine::upload(const HostBatch& h, std::uint64_t dropout_seed) {
  MicroBatch mb;
  const std::int64_t n = static_cast<std::int64_t>(h.ids.size());
  mb.ids = b_.empty(Shape{n}, DType::i32);
  mb.targets = b_.empty(Shape{n}, DType::i32);
  b_.write(mb.ids, h.ids);
  b_.write(mb.targets, h.targets);
  mb.batch = h.batch;
  mb.seq = h.seq;
  mb.dropout_seed = dropout_seed;
  return mb;
}

Tensor StepEngine::run_microbatch(const MicroBatch& mb, float loss_scale) {
  SavedActivations saved;
  Tensor loss_sum = chunk_->forward(mb, Tensor(), saved);
  chunk_->backward(mb, saved, Tensor(), loss_scale);
  return loss_sum;
}

Result<StepResult> StepEngine::step(const std::vector<HostBatch>& microbatches, float lr, std::int64_t step) {
  if (static_cast<int>(microbatches.size()) != plan_.microbatches())
    return make_error("step {}: got {} micro-batches, the plan runs {}", step, microbatches.size(),
                      plan_.microbatches());
  ParameterStore& params = chunk_->parameters();
  params.zero_grads();
  b_.fill(loss_total_, 0.f);
  const double tokens = static_cast<double>(plan_.effective_global_batch()) * microbatches.front().seq;
  const float loss_scale = static_cast<float>(1.0 / tokens);
  for (std::size_t i = 0; i < microbatches.size(); ++i) {
    const std::uint64_t seed = mix64(options_.seed ^ mix64(static_cast<std::uint64_t>(step) * 1000003u + i));
    Tensor loss_sum = run_microbatch(upload(microbatches[i], seed), loss_scale);
    b_.axpy(1.f, loss_sum, loss_total_);
  }
  b_.sum_squares(params.grads(), grad_sumsq_, false);
  float host[2] = {0, 0};
  MT_TRY(b_.read(loss_total_, std::span<float>(host, 1)));
  MT_TRY(b_.read(grad_sumsq_, std::span<float>(host + 1, 1)));
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
  for (const ParamSlot& slot : params.slots()) {
    const std::int64_t n = slot.value.numel();
    Tensor value = slot.value, m = adam_m_.slice(slot.offset, n), v = adam_v_.slice(slot.offset, n);
    AdamWOp op{lr, o.beta1, o.beta2, o.eps, slot.info.weight_decay ? o.weight_decay : 0.f, step};
    b_.adamw(value, slot.grad, m, v, coef, op);
  }
  return r;
}

Result<double> StepEngine::evaluate(const std::vector<HostBatch>& batches) {
  b_.fill(loss_total_, 0.f);
  double tokens = 0;
  for (const HostBatch& h : batches) {
    SavedActivations saved;
    Tensor loss_sum = chunk_->forward(upload(h, 0), Tensor(), saved);
    b_.axpy(1.f, loss_sum, loss_total_);
    tokens += static_cast<double>(h.ids.size());
  }
  float host = 0;
  MT_TRY(b_.read(loss_total_, std::span<float>(&host, 1)));
  return host / tokens;
}

Result<std::map<std::string, std::vector<float>>> StepEngine::export_state() {
  std::map<std::string, std::vector<float>> out;
  for (const ParamSlot& slot : chunk_->parameters().slots()) {
    const std::int64_t n = slot.value.numel();
    for (auto [prefix, t] : {std::pair<const char*, Tensor>{"params/", slot.value},
                             {"adam_m/", adam_m_.slice(slot.offset, n)},
                             {"adam_v/", adam_v_.slice(slot.offset, n)}}) {
      std::vector<float> host(static_cast<std::size_t>(n));
      MT_TRY(b_.read(t, host));
      out.emplace(prefix + slot.info.name, std::move(host));
    }
  }
  return out;
}

Status StepEngine::import_state(const std::map<std::string, std::vector<float>>& state) {
  for (const ParamSlot& slot : chunk_->parameters().slots()) {
    const std::int64_t n = slot.value.numel();
    for (auto [prefix, t] : {std::pair<const char*, Tensor>{"params/", slot.value},
                             {"adam_m/", adam_m_.slice(slot.offset, n)},
                             {"adam_v/", adam_v_.slice(slot.offset, n)}}) {
      auto it = state.find(prefix + slot.info.name);
      if (it == state.end()) return make_error("the checkpoint has no tensor '{}{}'", prefix, slot.info.name);
      if (static_cast<std::int64_t>(it->second.size()) != n)
        return make_error("checkpoint tensor '{}{}' has {} elements, this run needs {}", prefix, slot.info.name,
                          it->second.size(), n);
      b_.write(t, it->second);
    }
  }
  return b_.synchronize();
}

}  // namespace meshtrain
