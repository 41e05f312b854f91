#include "engine/step/segmented_engine.h"

#include <cmath>

#include "engine/plan/segment_plan.h"
#include "models/block.h"

namespace meshtrain {

namespace {

// Backend::set_region names: what the sim reports per segment and boundary (engine/simulation/simulation.h).
std::string segment_region(std::size_t k) { return fmt::format("segment {}", k); }

}  // namespace

struct SegmentedEngine::Segment {
  Plan plan;
  Mesh mesh;
  std::unique_ptr<StepEngine> engine;  // null: this rank is not in the segment
  std::unique_ptr<Joined> boundary;
  bool leader = false;                 // this rank is the segment's first: it reports the segment's sums
  Segment(const Plan& p) : plan(p), mesh(p) {}
};

// A segment's two neighbours as its engine sees them: input and its
// gradient from the boundary before, output and its gradient to the one after.
class SegmentedEngine::Joined : public SegmentBoundary {
 public:
  Joined(SegmentBoundary* before, SegmentBoundary* after) : before_(before), after_(after) {}
  Tensor input(int j, const Shape& s, DType d) override { return before_->input(j, s, d); }
  void input_grad(int j, const Tensor& dx) override { before_->input_grad(j, dx); }
  void output(int j, const Tensor& y) override { after_->output(j, y); }
  Tensor output_grad(int j, const Shape& s, DType d) override { return after_->output_grad(j, s, d); }

 private:
  SegmentBoundary* before_;
  SegmentBoundary* after_;
};

SegmentedEngine::~SegmentedEngine() = default;

SegmentedEngine::SegmentedEngine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options)
    : b_(b), m_(m), plan_(p), options_(options), world_(segments_world(p)) {
  const int rank = b.rank();
  auto holds = [rank](const Plan& s) { return rank >= s.first_rank && rank < s.first_rank + s.world_size(); };
  const ModelBlocks blocks = model_blocks(m);
  const int seq = p.effective_seq_len(m);
  for (const Plan& s : p.segments) {
    segments_.push_back(std::make_unique<Segment>(s));
    Segment& seg = *segments_.back();
    seg.leader = rank == s.first_rank;
    if (holds(s)) seg.engine = std::make_unique<StepEngine>(b, m, s, seg.mesh, options);
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k) {
    const Plan &producer = p.segments[k], &consumer = p.segments[k + 1];
    if (!holds(producer) && !holds(consumer)) {
      boundaries_.push_back(nullptr);
      continue;
    }
    const BlockIo io = blocks[static_cast<std::size_t>(block_range(producer, m).last)]->io(seq);
    boundaries_.push_back(std::make_unique<BoundaryExchange>(b, static_cast<int>(k), producer, consumer,
                                                             io.tokens_out, io.width_out,
                                                             activation_dtype(p.precision)));
  }
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& seg = *segments_[k];
    if (!seg.engine) continue;
    SegmentBoundary* before = k > 0 ? boundaries_[k - 1]->consumer_side() : nullptr;
    SegmentBoundary* after = k + 1 < segments_.size() ? boundaries_[k]->producer_side() : nullptr;
    seg.boundary = std::make_unique<Joined>(before, after);
    seg.engine->set_boundary(seg.boundary.get());
  }
  sums_ = b.empty(Shape{3});
  coef_ = b.empty(Shape{1});
}

DataShare SegmentedEngine::data_share() const { return {0, 1, plan_.effective_global_batch(), 1}; }

std::vector<HostBatch> SegmentedEngine::replica_batches(const Segment& s, const std::vector<HostBatch>& all,
                                                        const SampleLayout& layout) const {
  std::vector<HostBatch> out;
  const int d = s.mesh.coord_of(b_.rank()).dp;
  for (const SampleRange& r : layout[static_cast<std::size_t>(d)]) {
    // Both layouts keep a micro-batch within one of the batches given: find it.
    std::int64_t first = 0;
    for (const HostBatch& h : all) {
      if (r.begin < first + h.batch) {
        out.push_back(sample_range(h, r.begin - first, r.end - first));
        break;
      }
      first += h.batch;
    }
  }
  return out;
}


void SegmentedEngine::run_passes(bool training) {
  const std::size_t n = segments_.size();
  for (std::size_t k = 0; k < n; ++k) {
    b_.set_region(segment_region(k));
    if (StepEngine* e = segments_[k]->engine.get()) {
      if (!training) e->run_evaluation();
      else e->run(k + 1 == n ? StepEngine::Phase::all : StepEngine::Phase::forward);
    }
    if (k + 1 < n && boundaries_[k] && boundaries_[k]->same_ranks() && segments_[k]->engine)
      boundaries_[k]->exchange_forward();
  }
  if (!training) return;
  for (std::size_t k = n - 1; k-- > 0;) {
    if (boundaries_[k] && boundaries_[k]->same_ranks() && segments_[k]->engine) boundaries_[k]->exchange_backward();
    b_.set_region(segment_region(k));
    if (StepEngine* e = segments_[k]->engine.get()) e->run(StepEngine::Phase::backward);
  }
}

Result<StepResult> SegmentedEngine::step(const std::vector<HostBatch>& batches, float lr, std::int64_t step) {
  const int G = plan_.effective_global_batch();
  if (batches.size() != 1 || batches.front().batch != G)
    return make_error("step {}: a plan made of segments takes the global batch of {} samples as one batch, got "
                      "{} batch(es) of {}",
                      step, G, batches.size(), batches.empty() ? 0 : batches.front().batch);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& s = *segments_[k];
    if (k + 1 < segments_.size() && boundaries_[k])
      boundaries_[k]->set_layouts(training_layout(s.plan), training_layout(segments_[k + 1]->plan));
    b_.set_region(segment_region(k));
    if (s.engine)
      MT_TRY(s.engine->begin_step(replica_batches(s, batches, training_layout(s.plan)), step)
                 .context(fmt::format("segment '{}'", s.plan.segment_name)));
  }
  run_passes(true);
  b_.set_region("all segments");
  b_.fill(sums_, 0.f);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    const auto& s = segments_[k];
    if (!s->engine) continue;
    b_.set_region(segment_region(k));
    MT_TRY(s->engine->finish_gradients());
    const Tensor& sumsq = s->engine->reduce_grad_norm();
    const Tensor& loss = s->engine->reduce_loss();
    if (!s->leader) continue;
    Tensor sums_loss = sums_.slice(0, 1), sums_sq = sums_.slice(1, 1);
    b_.axpy(1.f, loss, sums_loss);
    b_.axpy(1.f, sumsq, sums_sq);
  }
  b_.set_region("all segments");
  b_.all_reduce(sums_, world_, ReduceOp::sum);
  float host[3] = {0, 0, 0};
  MT_TRY(b_.read(sums_, host).context(fmt::format("step {}", step)));
  const float max_norm = options_.optimizer.max_grad_norm;
  if (max_norm > 0) b_.clip_coefficient(sums_.slice(1, 1), max_norm, coef_);
  const double terms = static_cast<double>(G) * static_cast<double>(loss_terms_per_sample(m_, batches.front().seq));
  const StepResult r{host[0] / terms, std::sqrt(static_cast<double>(host[1])), {}};
  MT_TRY(check_finite(r, step));
  const Tensor coef = max_norm > 0 ? coef_ : Tensor();
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    b_.set_region(segment_region(k));
    if (segments_[k]->engine) segments_[k]->engine->apply_update(lr, step, coef);
  }
  b_.set_region("");
  return r;
}

Result<Evaluation> SegmentedEngine::evaluate_metrics(const std::vector<HostBatch>& batches) {
  std::vector<std::int64_t> sizes;
  for (const HostBatch& h : batches) sizes.push_back(h.batch);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& s = *segments_[k];
    if (k + 1 < segments_.size() && boundaries_[k])
      boundaries_[k]->set_layouts(evaluation_layout(s.plan, sizes), evaluation_layout(segments_[k + 1]->plan, sizes));
    if (s.engine) MT_TRY(s.engine->begin_evaluation(replica_batches(s, batches, evaluation_layout(s.plan, sizes))));
  }
  run_passes(false);
  b_.fill(sums_, 0.f);
  for (auto& s : segments_) {
    if (!s->engine) continue;
    const Tensor& stats = s->engine->evaluation_stats();
    if (s->leader) b_.axpy(1.f, stats, sums_);
  }
  b_.all_reduce(sums_, world_, ReduceOp::sum);
  float host[3] = {0, 0, 0};
  MT_TRY(b_.read(sums_, host));
  if (!(host[1] > 0)) return make_error("evaluation needs at least one held-out sample");
  return Evaluation{static_cast<double>(host[0]) / host[1], static_cast<double>(host[2]) / host[1]};
}

Result<std::map<std::string, std::vector<float>>> SegmentedEngine::export_state() {
  // Each segment's engine gathers its parameters on its ranks; its first rank
  // then broadcasts them, packed in name order, to every rank.
  std::map<std::string, std::vector<float>> out;
  for (auto& s : segments_) {
    std::map<std::string, std::vector<float>> mine;
    if (s->engine) {
      MT_ASSIGN(mine, s->engine->export_state());
    }
    std::vector<std::pair<std::string, std::int64_t>> names;  // the segment's tensors, in name order
    for (const ParamInfo& info : parameter_table(m_))
      if (s->plan.stage_split().holds(m_, info.layer))
        for (const char* prefix : {"adam_m/", "adam_v/", "params/"}) names.push_back({prefix + info.name, info.numel()});
    std::sort(names.begin(), names.end());
    std::int64_t total = 0;
    for (const auto& [name, n] : names) total += n;
    std::vector<float> flat(static_cast<std::size_t>(total));
    if (s->leader) {
      std::int64_t at = 0;
      for (const auto& [name, n] : names) {
        const std::vector<float>& v = mine.at(name);
        std::copy(v.begin(), v.end(), flat.begin() + at);
        at += n;
      }
    }
    Tensor t = b_.empty(Shape{total});
    if (s->leader) b_.write(t, flat);
    b_.broadcast(t, world_, s->plan.first_rank);
    MT_TRY(b_.read(t, flat));
    std::int64_t at = 0;
    for (const auto& [name, n] : names) {
      out[name].assign(flat.begin() + at, flat.begin() + at + n);
      at += n;
    }
  }
  return out;
}

Status SegmentedEngine::import_state(const std::map<std::string, std::vector<float>>& state) {
  for (auto& s : segments_)
    if (s->engine) MT_TRY(s->engine->import_state(state).context(fmt::format("segment '{}'", s->plan.segment_name)));
  return ok_status();
}

Result<std::vector<float>> SegmentedEngine::export_rank_state() {
  std::vector<float> out;
  for (auto& s : segments_)
    if (s->engine) {
      MT_ASSIGN(std::vector<float> mine, s->engine->export_rank_state());
      out.insert(out.end(), mine.begin(), mine.end());
    }
  return out;
}

Status SegmentedEngine::import_rank_state(std::span<const float> state) {
  std::size_t at = 0, needed = 0;
  for (auto& s : segments_)
    if (s->engine) needed += static_cast<std::size_t>(s->engine->rank_state_numel());
  if (state.size() != needed)
    return make_error("the checkpoint holds {} values of this rank's own state (1bit error feedback), its "
                      "segments need {}", state.size(), needed);
  for (auto& s : segments_)
    if (s->engine) {
      const auto n = static_cast<std::size_t>(s->engine->rank_state_numel());
      MT_TRY(s->engine->import_rank_state(state.subspan(at, n)));
      at += n;
    }
  return ok_status();
}

}  // namespace meshtrain
