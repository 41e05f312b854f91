#include "engine/step/training_engine.h"

#include <algorithm>
#include <cmath>

#include "engine/plan/segment_plan.h"
#include "engine/step/fp8_training.h"
#include "models/block.h"

namespace meshtrain {

struct TrainingEngine::Segment {
  Plan plan;
  Mesh mesh;
  std::unique_ptr<StepEngine> engine;  // null: this rank is not in the segment
  std::unique_ptr<Joined> boundary;
  bool leader = false;                 // this rank is the segment's first: it reports the segment's sums
  explicit Segment(const Plan& p) : plan(p), mesh(p) {}
};

// A segment's two neighbours as its engine sees them: input and its
// gradient from the boundary before, output and its gradient to the one after.
class TrainingEngine::Joined : public SegmentBoundary {
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

namespace {

// `s` with the segment's name for context, where the plan has named segments.
Status& named(Status& s, const Plan& segment) {
  if (!segment.segment_name.empty()) s.context(fmt::format("segment '{}'", segment.segment_name));
  return s;
}

}  // namespace

TrainingEngine::~TrainingEngine() = default;

TrainingEngine::TrainingEngine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options)
    : b_(b), m_(m), plan_(p), options_(options), main_(b.current_stream()) {
  const int rank = b.rank();
  auto holds = [rank](const Plan& s) { return rank >= s.first_rank && rank < s.first_rank + s.world_size(); };
  for (const Plan& s : plan_segments(p)) {
    segments_.push_back(std::make_unique<Segment>(s));
    Segment& seg = *segments_.back();
    seg.leader = rank == s.first_rank;
    if (holds(s)) seg.engine = std::make_unique<StepEngine>(b, m, s, seg.mesh, options);
  }
  const ModelBlocks blocks = model_blocks(m);
  const int seq = p.effective_seq_len(m);
  for (std::size_t k = 0; k + 1 < segments_.size(); ++k) {
    const Plan &producer = segments_[k]->plan, &consumer = segments_[k + 1]->plan;
    if (!holds(producer) && !holds(consumer)) {
      boundaries_.push_back(nullptr);
      continue;
    }
    const BlockIo io = blocks[static_cast<std::size_t>(block_range(producer, m).last)]->io(seq);
    boundaries_.push_back(std::make_unique<BoundaryExchange>(b, static_cast<int>(k), producer, consumer,
                                                             io.tokens_out, io.width_out,
                                                             activation_dtype(p.precision, options)));
  }
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& seg = *segments_[k];
    if (!seg.engine || one_segment()) continue;
    SegmentBoundary* before = k > 0 ? boundaries_[k - 1]->consumer_side() : nullptr;
    SegmentBoundary* after = k + 1 < segments_.size() ? boundaries_[k]->producer_side() : nullptr;
    seg.boundary = std::make_unique<Joined>(before, after);
    seg.engine->set_boundary(seg.boundary.get());
  }
  if (!one_segment()) {
    world_ = plan_world(p);
    sums_ = b.empty(Shape{3});
  }
  coef_ = b.empty(Shape{1});
}

void TrainingEngine::enter(std::size_t k) {
  if (!one_segment()) b_.set_region(fmt::format("segment {}", k));  // what the sim reports per segment
}

void TrainingEngine::enter(const std::string& name) {
  if (!one_segment()) b_.set_region(name);
}

void TrainingEngine::join(Stream waiting, Stream done) {
  if (waiting != done) b_.wait(waiting, b_.record(done));
}

StepEngine& TrainingEngine::first_engine() {
  for (auto& s : segments_)
    if (s->engine) return *s->engine;
  throw std::logic_error("TrainingEngine: rank in no segment (validate_segments uses every rank)");
}

DataShare TrainingEngine::data_share() const {
  if (!one_segment()) return {0, 1, plan_.effective_global_batch(), 1};
  const Segment& s = *segments_.front();
  return {s.mesh.coord_of(b_.rank()).dp, s.plan.dp, s.plan.micro_batch, s.plan.microbatches()};
}

std::vector<HostBatch> TrainingEngine::replica_batches(const Segment& s, const std::vector<HostBatch>& given,
                                                       const SampleLayout& layout) const {
  if (one_segment()) return given;
  std::vector<HostBatch> out;
  const int d = s.mesh.coord_of(b_.rank()).dp;
  for (const SampleRange& r : layout[static_cast<std::size_t>(d)]) {
    // Both layouts keep a micro-batch within one of the batches given: find it.
    std::int64_t first = 0;
    for (const HostBatch& h : given) {
      if (r.begin < first + h.batch) {
        out.push_back(sample_range(h, r.begin - first, r.end - first));
        break;
      }
      first += h.batch;
    }
  }
  return out;
}

void TrainingEngine::run_passes(bool training) {
  const std::size_t n = segments_.size();
  for (std::size_t k = 0; k < n; ++k) {
    enter(k);
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
    enter(k);
    if (StepEngine* e = segments_[k]->engine.get()) e->run(StepEngine::Phase::backward);
  }
}

Result<Tensor> TrainingEngine::step_totals(std::int64_t step) {
  enter("all segments");
  if (!one_segment()) b_.fill(sums_, 0.f);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    const Segment& s = *segments_[k];
    if (!s.engine) continue;
    enter(k);
    MT_TRY(s.engine->reduce_statistics(step));
    if (one_segment()) return s.engine->step_stats();
    // The sums are taken on the main stream; an overlapping segment reduced its statistics on its own.
    join(main_, s.engine->update_stream());
    if (!s.leader) continue;
    Tensor sums_loss = sums_.slice(0, 1), sums_sq = sums_.slice(1, 1);
    b_.axpy(1.f, s.engine->step_stats().slice(0, 1), sums_loss);
    b_.axpy(1.f, s.engine->step_stats().slice(1, 1), sums_sq);
  }
  enter("all segments");
  b_.all_reduce(sums_, world_, ReduceOp::sum);
  return sums_.slice(0, 2);
}

Result<StepResult> TrainingEngine::step(const std::vector<HostBatch>& batches, float lr, std::int64_t step) {
  const int G = plan_.effective_global_batch();
  if (!one_segment() && (batches.size() != 1 || batches.front().batch != G))
    return make_error("step {}: a plan made of segments takes the global batch of {} samples as one batch, got "
                      "{} batch(es) of {}",
                      step, G, batches.size(), batches.empty() ? 0 : batches.front().batch);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& s = *segments_[k];
    if (k + 1 < segments_.size() && boundaries_[k])
      boundaries_[k]->set_layouts(training_layout(s.plan), training_layout(segments_[k + 1]->plan));
    enter(k);
    if (!s.engine) continue;
    Status begun = s.engine->begin_step(replica_batches(s, batches, training_layout(s.plan)), step, lr);
    MT_TRY(named(begun, s.plan));
  }
  run_passes(true);
  MT_ASSIGN(const Tensor totals, step_totals(step));
  StepEngine& lead = first_engine();
  // Where the totals are: one segment's on its update stream, the sums over several on the main stream.
  const Stream totals_stream = one_segment() ? lead.update_stream() : main_;
  float host[2] = {0, 0};
  {
    StreamScope on(b_, totals_stream);
    MT_TRY(b_.read(totals, host).context(fmt::format("step {}", step)));
  }
  const double terms = static_cast<double>(G) * static_cast<double>(loss_terms_per_sample(m_, batches.front().seq));
  StepResult r{host[0] / terms, std::sqrt(static_cast<double>(host[1])), {}};
  // A second wait, for MoE models only: their routing statistics are read after the loss. Folding them
  // into the step's statistics would need their sums reduced before the loss's read, on the loss's stream.
  if (model_io(m_).routes_to_experts) {
    MT_ASSIGN(r.moe, lead.moe_statistics());
  }
  const float max_norm = options_.optimizer.max_grad_norm;
  // Overlapped without clipping, every bucket was updated during backward, before this read: say so.
  const bool overlapped = std::any_of(segments_.begin(), segments_.end(),
                                      [](const auto& s) { return s->engine && s->plan.overlap_update; });
  if (overlapped && max_norm <= 0 && !check_finite(r, step).ok())
    return make_error("step {}: the loss is {} (gradient norm {}); with --overlap-update and no --grad-clip each "
                      "gradient bucket's update ran as soon as it was reduced, before the loss was read, so the "
                      "parameters already hold this step's update and are no longer those of step {}; resume from "
                      "the last checkpoint, and lower --lr or check the data",
                      step, r.loss, r.grad_norm, step - 1);
  MT_TRY(check_finite(r, step));
  Tensor coef;
  if (max_norm > 0) {
    StreamScope on(b_, totals_stream);
    b_.clip_coefficient(totals.slice(1, 1), max_norm, coef_);
    coef = coef_;
  }
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    enter(k);
    StepEngine* e = segments_[k]->engine.get();
    if (!e) continue;
    if (coef.defined()) join(e->update_stream(), totals_stream);
    e->finish_update(coef);
  }
  enter("");
  return r;
}

Result<Evaluation> TrainingEngine::evaluate_metrics(const std::vector<HostBatch>& batches) {
  std::vector<std::int64_t> sizes;
  for (const HostBatch& h : batches) sizes.push_back(h.batch);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    Segment& s = *segments_[k];
    if (k + 1 < segments_.size() && boundaries_[k])
      boundaries_[k]->set_layouts(evaluation_layout(s.plan, sizes), evaluation_layout(segments_[k + 1]->plan, sizes));
    if (s.engine) MT_TRY(s.engine->begin_evaluation(replica_batches(s, batches, evaluation_layout(s.plan, sizes))));
  }
  run_passes(false);
  Tensor stats;
  if (one_segment()) {
    stats = first_engine().evaluation_stats();
  } else {
    b_.fill(sums_, 0.f);
    for (auto& s : segments_) {
      if (!s->engine) continue;
      const Tensor& mine = s->engine->evaluation_stats();
      if (s->leader) b_.axpy(1.f, mine, sums_);
    }
    b_.all_reduce(sums_, world_, ReduceOp::sum);
    stats = sums_;
  }
  float host[3] = {0, 0, 0};
  MT_TRY(b_.read(stats, host));
  if (!(host[1] > 0)) return make_error("evaluation needs at least one held-out sample");
  return Evaluation{static_cast<double>(host[0]) / host[1], static_cast<double>(host[2]) / host[1]};
}

Result<std::map<std::string, std::vector<float>>> TrainingEngine::export_state() {
  // A segment on every rank has gathered its whole state on each of them.
  if (one_segment()) return first_engine().export_state();
  // Each segment's engine gathers its parameters (and FP8 scaling state) on its ranks; its first rank
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
    if (options_.emulate_fp8)
      for (auto& named : fp8_state_sizes(m_, s->plan)) names.push_back(std::move(named));
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

Status TrainingEngine::import_state(const std::map<std::string, std::vector<float>>& state) {
  for (auto& s : segments_) {
    if (!s->engine) continue;
    Status done = s->engine->import_state(state);
    MT_TRY(named(done, s->plan));
  }
  return ok_status();
}

Result<std::vector<float>> TrainingEngine::export_rank_state() {
  std::vector<float> out;
  for (auto& s : segments_)
    if (s->engine) {
      MT_ASSIGN(std::vector<float> mine, s->engine->export_rank_state());
      out.insert(out.end(), mine.begin(), mine.end());
    }
  return out;
}

Status TrainingEngine::import_rank_state(std::span<const float> state) {
  if (one_segment()) return first_engine().import_rank_state(state);
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

std::unique_ptr<TrainingEngine> make_engine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options) {
  return std::make_unique<TrainingEngine>(b, m, p, std::move(options));
}

}  // namespace meshtrain
