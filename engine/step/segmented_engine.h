// One rank's engine for a plan made of segments (segment_plan.h): a
// StepEngine for each segment the rank is in, on that segment's mesh, and a
// BoundaryExchange for each boundary it touches, run as one iteration:
//
//   forward:  every segment in order: the segments before the last run the
//             forward half of their GPipe schedule (all micro-batches), the
//             last its whole schedule; activations cross each boundary as
//             the producer makes them (disjoint ranks) or in one all-to-all
//             once the producer's half is done (the same ranks);
//   backward: the segments before the last in reverse order, their
//             backward halves, gradients crossing the boundaries back;
//   update:   every segment reduces its own gradients (its dp, ZeRO); the
//             loss and the squared gradient norm are summed over segments by
//             one all-reduce over every rank (each segment's first rank
//             contributes its segment's), and one clip coefficient scales
//             every segment's AdamW step.
//
// Every rank reads the whole global batch (DataShare: one replica, one
// micro-batch of the global batch) and passes each of its segments the
// samples of its replica's micro-batches, so a segment's data parallelism
// and micro-batches are its own. The result is the single-rank run's up to
// float reordering (tests/parallel/test_parallel_segments.cc).
#pragma once

#include <memory>
#include <vector>

#include "engine/step/segment_boundary.h"
#include "engine/step/training_engine.h"

namespace meshtrain {

class SegmentedEngine : public TrainingEngine {
 public:
  SegmentedEngine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options);
  ~SegmentedEngine() override;

  DataShare data_share() const override;
  // `batches`: the whole global batch as one HostBatch (data_share()).
  Result<StepResult> step(const std::vector<HostBatch>& batches, float lr, std::int64_t step) override;
  // `batches`: every held-out batch (each segment's replica d evaluates batches d, d + dp, ...).
  Result<Evaluation> evaluate_metrics(const std::vector<HostBatch>& batches) override;
  Result<std::map<std::string, std::vector<float>>> export_state() override;
  Status import_state(const std::map<std::string, std::vector<float>>& state) override;
  // The rank's segments' own state, in segment order.
  Result<std::vector<float>> export_rank_state() override;
  Status import_rank_state(std::span<const float> state) override;

 private:
  struct Segment;
  class Joined;
  // Runs the forward and backward passes of all segments (training) or the forward (evaluation).
  void run_passes(bool training);
  std::vector<HostBatch> replica_batches(const Segment& s, const std::vector<HostBatch>& all,
                                         const SampleLayout& layout) const;

  Backend& b_;
  ModelSpec m_;
  Plan plan_;
  StepOptions options_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::vector<std::unique_ptr<BoundaryExchange>> boundaries_;  // k: between segments k and k + 1; null if not ours
  Group world_;
  Tensor sums_, coef_;
};

}  // namespace meshtrain
