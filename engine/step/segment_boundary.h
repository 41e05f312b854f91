// The reshard between two consecutive segments of a plan: the activations
// that leave the producer's last pipeline stage, and the gradients that come
// back, moved sample by sample to the ranks the consumer needs them on.
//
// Both segments cut the batch into micro-batches of contiguous samples, each
// replica its own (a SampleLayout). A piece is the samples one producer
// micro-batch and one consumer micro-batch share; it travels from the
// producer's last-stage rank of tensor-parallel index t = t' mod tp_P to the
// consumer's first-stage rank t' (every tensor-parallel rank holds the whole
// activation; sequence parallelism is gathered first and sliced after), and
// its gradient from the consumer's rank t mod tp_C back to producer rank t.
//
// Two ways, by where the segments are (validate_segments allows no other):
//  * disjoint ranks (the consumer is a downstream pipeline stage of the
//    producer): every piece is a send/recv as it is ready, so the consumer
//    works on micro-batch k while the producer computes k + 1. Each pair of
//    ranks sends and receives its pieces in increasing sample order, forward
//    and backward (every schedule runs a segment's micro-batches in order),
//    which is the order NCCL and the sim pair point-to-point messages in.
//  * the same ranks: the producer's forward half ends before the consumer's
//    starts, so the pieces wait on their rank until the segmented engine
//    calls exchange_forward(), one all-to-all over the segment's ranks
//    (exchange_backward() for the gradients, before the producer's backward
//    half). A send/recv here would deadlock NCCL, where two ranks that send
//    to each other first both wait.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "backends/backend.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "engine/step/step_engine.h"

namespace meshtrain {

// The iteration's part the backend attributes work to (Backend::set_region), for a scope.
class RegionScope {
 public:
  RegionScope(Backend& b, std::string name) : b_(b), previous_(b.set_region(std::move(name))) {}
  ~RegionScope() { b_.set_region(previous_); }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  Backend& b_;
  std::string previous_;
};

// "boundary k": the region of the exchange between segments k and k + 1.
std::string boundary_region(int index);

struct SampleRange {
  std::int64_t begin = 0, end = 0;  // sample indices [begin, end) of the batch the step or evaluation passes
};
// layout[d][j]: the samples of replica d's micro-batch j.
using SampleLayout = std::vector<std::vector<SampleRange>>;

// A segment's training layout: replica d's share of the global batch in equal micro-batches.
SampleLayout training_layout(const Plan& segment);
// Its evaluation layout over batches of `sizes` (in order): batch i is micro-batch i / dp of replica i mod dp.
SampleLayout evaluation_layout(const Plan& segment, const std::vector<std::int64_t>& sizes);

// One rank's side of the boundary `index` between segments `producer` and
// `consumer`. The rank's segment engines reach it through the
// SegmentBoundary interface: the producer's engine its output and
// output_grad, the consumer's its input and input_grad.
class BoundaryExchange {
 public:
  // `tokens` and `width`: a sample's rows at the boundary and their width.
  BoundaryExchange(Backend& b, int index, const Plan& producer, const Plan& consumer, std::int64_t tokens,
                   std::int64_t width, DType dtype);

  // The micro-batches of the step or evaluation about to run.
  void set_layouts(SampleLayout produced, SampleLayout consumed);
  bool same_ranks() const { return same_ranks_; }
  // Same ranks only: every piece of the forward (backward) pass to its rank.
  // Collective over the segments' ranks.
  void exchange_forward() { exchange(false); }
  void exchange_backward() { exchange(true); }

  SegmentBoundary* producer_side() { return &producer_side_; }
  SegmentBoundary* consumer_side() { return &consumer_side_; }

 private:
  // Samples [samples) of micro-batch `j` at this end, from or to `peer`.
  struct Piece {
    SampleRange samples;
    int peer = 0;
    std::int64_t row = 0;  // first row in this end's (whole) micro-batch tensor
  };
  // The pieces of this rank's micro-batch j that it sends (the producer's
  // activations, the consumer's gradients) or receives.
  std::vector<Piece> pieces(int j, bool gradient, bool sending) const;
  Tensor receive(int j, bool gradient);
  void send(int j, const Tensor& x, bool gradient);
  void exchange(bool gradient);
  // The whole rows of a micro-batch tensor that sequence parallelism splits
  // over the tensor-parallel group (an all-gather), and this rank's rows of a whole one.
  Tensor whole(const Tensor& x, const Plan& p, const Mesh& mesh);
  Tensor own_rows(const Tensor& x, const Plan& p, const Mesh& mesh);
  std::int64_t rows(const SampleRange& r) const { return (r.end - r.begin) * tokens_; }
  // The point-to-point tag of a piece: (boundary, direction, first sample), so a pair of ranks never confuses two.
  int tag(bool gradient, std::int64_t first_sample) const;

  class Side : public SegmentBoundary {
   public:
    explicit Side(BoundaryExchange& e) : e_(e) {}
    Tensor input(int j, const Shape&, DType) override { return e_.receive(j, false); }
    void output(int j, const Tensor& y) override { e_.send(j, y, false); }
    Tensor output_grad(int j, const Shape&, DType) override { return e_.receive(j, true); }
    void input_grad(int j, const Tensor& dx) override { e_.send(j, dx, true); }

   private:
    BoundaryExchange& e_;
  };

  Backend& b_;
  int index_;
  Plan producer_, consumer_;
  Mesh producer_mesh_, consumer_mesh_;
  bool same_ranks_;
  Group ranks_;  // the segments' ranks, when they are the same
  SampleLayout produced_, consumed_;
  std::int64_t tokens_, width_;
  DType dtype_;
  // Same ranks: whole micro-batch tensors by (gradient, micro-batch) waiting
  // for (after sending) or delivered by (after receiving) the exchange.
  std::map<std::pair<bool, int>, Tensor> outbox_, inbox_;
  Side producer_side_, consumer_side_;
};

}  // namespace meshtrain
