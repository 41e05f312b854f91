// TrainingEngine: one rank's engine for a whole plan, what the training
// loop, the simulator and the tests drive. A plan is a sequence of segments
// (engine/plan/segment_plan.h); a uniform plan is a plan of one segment. The
// engine holds a StepEngine (step_engine.h) for each segment the rank is in,
// on that segment's mesh, and a BoundaryExchange (segment_boundary.h) for
// each boundary it touches, and runs them as one iteration:
//
//   forward:  every segment in order: the segments before the last run the
//             forward half of their GPipe schedule (all micro-batches), the
//             last its whole schedule; activations cross each boundary as
//             the producer makes them (disjoint ranks) or in one all-to-all
//             once the producer's half is done (the same ranks);
//   backward: the segments before the last in reverse order, their
//             backward halves, gradients crossing the boundaries back;
//   update:   every segment reduces its own gradients (its dp, ZeRO) and its
//             loss and squared gradient norm over its ranks; a segment that
//             spans every rank (a uniform plan) has the step's totals, else
//             one all-reduce over every rank sums them (each segment's first
//             rank contributes its segment's); one clip coefficient scales
//             every segment's AdamW step.
//
// The host waits for the device once per step: one read of the loss and the
// gradient norm at the end of the iteration (the progress line needs them;
// a NaN loss must stop the run before the update, so the parameters stay
// those of the last good step), plus one for a mixture-of-experts model's
// routing statistics and, under precision fp8 with delayed scaling, one for
// the amax. Errors of
// any collective on the way (a timeout names op, group and peers) surface
// there, as the Status of step(). The result is the single-rank run's up to
// float reordering (tests/parallel/).
//
// Every rank constructs a TrainingEngine for the same plan and calls each
// method the same number of times in the same order: they are collective.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/plan/plan.h"
#include "engine/step/segment_boundary.h"
#include "engine/step/step_engine.h"
#include "models/model_spec.h"

namespace meshtrain {

// The samples one rank passes to step(): replica `replica` of `replicas`
// (the data-parallel split of the loader), `count` micro-batches of
// `micro_batch` samples each.
struct DataShare {
  int replica = 0, replicas = 1;
  int micro_batch = 1, count = 1;
};

class TrainingEngine {
 public:
  TrainingEngine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options);
  ~TrainingEngine();
  // The segments' engines and boundaries hold references into this one.
  TrainingEngine(const TrainingEngine&) = delete;
  TrainingEngine& operator=(const TrainingEngine&) = delete;

  // A plan of one segment: its data-parallel replica's micro-batches (every
  // rank of a replica gets the same ones). Several: the whole global batch as
  // one batch; each segment takes its replica's micro-batches from it, so a
  // segment's data parallelism and micro-batches are its own.
  DataShare data_share() const;
  // One iteration over this rank's DataShare of the global batch, with
  // learning rate `lr` at 1-based optimizer step `step`. The objective is the
  // mean loss over the global batch's targets; the result is the same on
  // every rank. Under Plan::overlap_update without clipping the buckets'
  // updates ran during backward: a non-finite step's Error says that the
  // parameters already hold its update.
  Result<StepResult> step(const std::vector<HostBatch>& batches, float lr, std::int64_t step);
  // Loss and top-1 accuracy over held-out `batches` without updating
  // anything. One segment: this rank's replica's batches (each replica its
  // own, the mean over all). Several: every held-out batch (each segment's
  // replica d evaluates batches d, d + dp, ...).
  Result<Evaluation> evaluate_metrics(const std::vector<HostBatch>& batches);
  // The full parameters and AdamW moments by name (StepEngine::export_state), on every rank.
  Result<std::map<std::string, std::vector<float>>> export_state();
  Status import_state(const std::map<std::string, std::vector<float>>& state);
  // This rank's own plan-dependent state (StepEngine::export_rank_state: 1bit
  // error feedback), its segments' in segment order, which the checkpoint
  // keeps per rank. Not collective.
  Result<std::vector<float>> export_rank_state();
  Status import_rank_state(std::span<const float> state);

 private:
  struct Segment;
  class Joined;
  bool one_segment() const { return segments_.size() == 1; }
  // Attributes what follows to segment k's region (Backend::set_region), or to `name`; a plan of one
  // segment has no regions.
  void enter(std::size_t k);
  void enter(const std::string& name);
  // The first segment this rank is in (every rank is in one).
  StepEngine& first_engine();
  // What segment `s` reads of the `given` batches (data_share): the batches of its replica.
  std::vector<HostBatch> replica_batches(const Segment& s, const std::vector<HostBatch>& given,
                                         const SampleLayout& layout) const;
  // Runs the forward and backward passes of all segments (training) or the forward (evaluation).
  void run_passes(bool training);
  // (2) [Σ loss, Σ g²] of the step over every rank, after each segment's reduce_statistics.
  Result<Tensor> step_totals(std::int64_t step);
  // Makes `waiting` wait for the work issued so far on `done` (nothing when they are one stream).
  void join(Stream waiting, Stream done);

  Backend& b_;
  ModelSpec m_;
  Plan plan_;
  StepOptions options_;
  // The stream the segments' engines compute on (each one's compute stream); under overlap_update a
  // segment reduces and updates on a data-parallel stream of its own (StepEngine::update_stream).
  Stream main_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::vector<std::unique_ptr<BoundaryExchange>> boundaries_;  // k: between segments k and k + 1; null if not ours
  Group world_;  // every rank, for the sums over segments (several segments only)
  Tensor sums_;  // (3) the sums over segments of step_stats or evaluation_stats (several segments only)
  Tensor coef_;  // (1) the clip coefficient
};

// The engine of rank b.rank() for plan `p`.
std::unique_ptr<TrainingEngine> make_engine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options);

}  // namespace meshtrain
