// Shared by the in-process and the MPI tests: a deterministic global batch,
// one rank's training run under a plan, and the comparison against the
// single-rank reference.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "engine/step/step_engine.h"
#include "engine/step/training_engine.h"
#include "models/init.h"
#include "models/model_spec.h"

namespace meshtrain::testing {

constexpr std::uint64_t kSeed = 20240601;  // printed by the tests that use it
constexpr int kSteps = 3;
constexpr int kSeq = 16;
constexpr int kMicroBatch = 2;
constexpr int kGlobalBatch = 8;  // sequences: 4 micro-batches per step in total

inline ModelSpec tiny_gpt() { return *model_preset("tiny"); }

inline ModelSpec tiny_llama() {
  ModelSpec m = tiny_gpt();
  m.name = "tiny-llama";
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.kv_heads = 2;
  m.ffn = 128;
  m.bias = false;
  m.tied_embeddings = false;
  return m;
}

// Six layers of the tiny model: enough for uneven pipeline splits (2 + 4,
// 1 + 4 + 1) whose stages differ in size and whose interleaved chunks do too.
inline ModelSpec tiny_gpt6() {
  ModelSpec m = tiny_gpt();
  m.name = "tiny-6";  // the reference cache keys on the name
  m.layers = 6;
  return m;
}

// Megatron-Core's uneven split (models/parameters.h, StageSplit): the first
// and last stage hold the given layer counts, 0 meaning an even share.
inline Plan with_stage_layers(Plan p, int first, int last) {
  p.first_stage_layers = first, p.last_stage_layers = last;
  return p;
}

inline Plan make_plan(int tp, int pp, int dp, int zero, ScheduleKind schedule, int vpp = 1) {
  Plan p;
  p.tp = tp, p.pp = pp, p.dp = dp, p.zero = zero, p.vpp = vpp, p.schedule = schedule;
  p.micro_batch = kMicroBatch;
  p.global_batch = kGlobalBatch;
  p.seq_len = kSeq;
  p.precision = Precision::fp32;
  p.grad_bucket_mb = 1.0 / 64;  // 16 KiB: several buckets per chunk, so overlap and ragged tails run
  return p;
}

inline StepOptions step_options() {
  StepOptions o;
  o.seed = kSeed;
  o.optimizer.max_grad_norm = 0.5f;  // small enough that clipping acts: the global norm must agree
  // Adam divides by sqrt(v) + eps: with eps 1e-8 the near-zero gradients turn
  // float reassociation noise (~1e-7, a different summation order per plan)
  // into 1e-4 relative parameter differences after one step (measured: the
  // error scales as 1/eps). eps 1e-4 keeps the comparison conditioned, so the
  // 1e-5 bound tests the plan and not Adam's conditioning.
  o.optimizer.eps = 1e-4f;
  return o;
}

// A vision model's global batch: images of counter-based noise in which the
// label (the brightest of `labels` image regions, default the classes) is learnable.
inline std::vector<HostBatch> global_images(const ModelSpec& m, int step, int labels = 0) {
  const int classes = labels > 0 ? labels : m.classes;
  std::vector<HostBatch> out;
  const int side = m.image_size, pixels = side * side * m.channels;
  for (int j = 0; j < kGlobalBatch / kMicroBatch; ++j) {
    HostBatch h;
    h.batch = kMicroBatch, h.seq = m.seq_len;
    for (int i = 0; i < kMicroBatch; ++i) {
      const std::uint64_t image = static_cast<std::uint64_t>(step * 1000 + j * 100 + i);
      const int label = static_cast<int>(mix64(kSeed ^ image) % static_cast<std::uint64_t>(classes));
      for (int p = 0; p < pixels; ++p) {
        const double u = static_cast<double>(mix64(kSeed ^ mix64(image * 65536 + p)) >> 11) * 0x1.0p-53;
        const bool lit = (p / m.channels) % classes == label;
        h.pixels.push_back(static_cast<float>(u - 0.5 + (lit ? 1.0 : 0.0)));
      }
      h.targets.push_back(label);
    }
    out.push_back(std::move(h));
  }
  return out;
}

// A VQA model's global batch: global_images' images (10 labels) with a
// question of counter-based ids each, whose answer word combines the image's
// label and the question's last id, so that both the encoder and the decoder learn.
inline std::vector<HostBatch> global_questions(const ModelSpec& m, int step) {
  std::vector<HostBatch> out = global_images(m, step, 10);
  for (std::size_t j = 0; j < out.size(); ++j) {
    HostBatch& h = out[j];
    h.seq = m.seq_len;
    for (int i = 0; i < h.batch; ++i) {
      for (int t = 0; t < m.question_len; ++t) {
        const auto counter = static_cast<std::uint64_t>(step * 100000 + static_cast<int>(j) * 1000 + i * 50 + t);
        const std::uint64_t key = mix64(kSeed ^ mix64(counter));
        h.ids.push_back(static_cast<std::int32_t>(1 + key % static_cast<std::uint64_t>(m.vocab - 1)));
      }
      std::int32_t& answer = h.targets[static_cast<std::size_t>(i)];
      answer = (answer + h.ids.back()) % m.vocab;
    }
  }
  return out;
}

// The global batch of a step as micro-batches, deterministic in (seed, step).
inline std::vector<HostBatch> global_batch(const ModelSpec& m, int step) {
  if (m.vqa()) return global_questions(m, step);
  if (m.vision()) return global_images(m, step);
  std::vector<HostBatch> out;
  for (int j = 0; j < kGlobalBatch / kMicroBatch; ++j) {
    HostBatch h;
    h.batch = kMicroBatch, h.seq = kSeq;
    for (int i = 0; i < kMicroBatch * kSeq; ++i) {
      const std::uint64_t key = mix64(kSeed ^ mix64(static_cast<std::uint64_t>(step * 1000 + j * 100 + i)));
      h.ids.push_back(static_cast<std::int32_t>(key % static_cast<std::uint64_t>(m.vocab)));
      // A learnable rule (next = id + 1) so the loss falls.
      h.targets.push_back(static_cast<std::int32_t>((key + 1) % static_cast<std::uint64_t>(m.vocab)));
    }
    out.push_back(std::move(h));
  }
  return out;
}

struct RankRun {
  std::vector<double> losses, grad_norms;
  double eval_loss = 0;  // evaluate() on step 1's batch after training
  std::map<std::string, std::vector<float>> state;  // filled on rank 0 only
};

// The samples of `parts` (micro-batches in order) re-cut into micro-batches of `micro_batch`.
inline std::vector<HostBatch> recut(const std::vector<HostBatch>& parts, int micro_batch) {
  HostBatch all = parts.front();
  for (std::size_t i = 1; i < parts.size(); ++i) {
    all.batch += parts[i].batch;
    all.ids.insert(all.ids.end(), parts[i].ids.begin(), parts[i].ids.end());
    all.targets.insert(all.targets.end(), parts[i].targets.begin(), parts[i].targets.end());
    all.pixels.insert(all.pixels.end(), parts[i].pixels.begin(), parts[i].pixels.end());
  }
  std::vector<HostBatch> out;
  for (int first = 0; first < all.batch; first += micro_batch) out.push_back(sample_range(all, first, first + micro_batch));
  return out;
}

// One rank's run: kSteps steps on its share of the global batch (its
// replica's micro-batches, or all of it for a plan made of segments), then
// the evaluation and the export.
inline Status run_rank(Backend& b, const ModelSpec& m, const Plan& p, RankRun& out,
                       const StepOptions& options = step_options()) {
  const std::unique_ptr<TrainingEngine> engine = make_engine(b, m, p, options);
  const DataShare share = engine->data_share();
  auto mine = [&](const std::vector<HostBatch>& all) {
    const std::vector<HostBatch> cut = recut(all, share.micro_batch);
    return std::vector<HostBatch>(cut.begin() + share.replica * share.count,
                                  cut.begin() + (share.replica + 1) * share.count);
  };
  for (int s = 1; s <= kSteps; ++s) {
    MT_ASSIGN(StepResult r, engine->step(mine(global_batch(m, s)), 1e-2f, s));
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
  }
  // Evaluation: a segmented plan takes every held-out batch, a uniform one its replica's.
  const std::vector<HostBatch> all = global_batch(m, 1);
  const int per = p.segments.empty() ? p.microbatches() : static_cast<int>(all.size());
  const int d = p.segments.empty() ? share.replica : 0;
  MT_ASSIGN(const Evaluation e, engine->evaluate_metrics({all.begin() + d * per, all.begin() + (d + 1) * per}));
  out.eval_loss = e.loss;
  MT_ASSIGN(auto state, engine->export_state());
  if (b.rank() == 0) out.state = std::move(state);
  return ok_status();
}

// ‖a - b‖₂ / ‖b‖₂ over one tensor (‖a - b‖₂ when b is all zeros).
//
// Norm-wise, not the largest element's error: after a few AdamW steps one
// element of a zero-initialised bias whose gradient is near zero carries an
// error that Adam's m / (sqrt(v) + eps) amplified, and which element that is
// depends on rounding anywhere upstream (a tanh of 3 ulp instead of 1 moved
// tp4's largest-element error from 5.7e-6 to 1.8e-5, with the plan's
// arithmetic unchanged). The norm measures the tensor, and a wrong partition,
// reduction or missing gradient still shows as an O(1) error.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    scale += static_cast<double>(b[i]) * b[i];
  }
  return scale > 0 ? std::sqrt(diff / scale) : std::sqrt(diff);
}

}  // namespace meshtrain::testing
