// PipelineExecutor: runs one pipeline rank's action list (engine/schedule)
// against a backend. The schedule says what happens in which order; this file
// only moves tensors: it receives a virtual stage's input activation before
// its forward, sends the output after it, and does the same for gradients in
// backward, with backend send/recv between neighbouring virtual stages.
//
// Tags are unique per (boundary, micro-batch, direction): the boundary
// between virtual stages s and s+1 is e = s, and
//   tag = (e·m + j)·2 + (0 for activations, 1 for gradients)
// so a receive pairs with exactly one send whatever order the peers issue.
// Legend: R rows, X width at a chunk boundary; p stages, v chunks, m micro-batches.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "backends/backend.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "engine/schedule/a2a_overlap.h"
#include "engine/schedule/builders.h"
#include "engine/schedule/schedule.h"

namespace meshtrain {

// The compute a pipeline rank runs, by local model chunk c and micro-batch j.
struct PipelineCompute {
  // Forward of (c, j) on `input` (R, X), undefined for virtual stage 0.
  // Returns the output (R, X); ignored for the last virtual stage.
  std::function<Tensor(int chunk, int microbatch, const Tensor& input)> forward;
  // Backward of (c, j) with `dout` (R, X), undefined for the last virtual
  // stage. Returns d input; ignored for virtual stage 0.
  std::function<Tensor(int chunk, int microbatch, const Tensor& dout)> backward;
  // Zero-bubble schedules: the parameter gradients of (c, j), which its
  // backward left for later (a schedule without W actions never calls it).
  std::function<void(int chunk, int microbatch)> weight;
  // The shape of local chunk c's input (output = false) or output for
  // micro-batch j: what arrives from, or leaves to, its neighbours (and the
  // gradients that go the other way).
  std::function<Shape(int chunk, int microbatch, bool output)> boundary;
  // EP all-to-all overlap (Plan::moe_a2a_overlap): forward of (cf, jf) and backward of (cb, jb)
  // as one interleaved pass, returning (forward output, d input). Empty: the executor runs each
  // alone. The schedule then pairs them (engine/schedule/a2a_overlap.h).
  std::function<std::pair<Tensor, Tensor>(int cf, int jf, const Tensor& input, int cb, int jb, const Tensor& dout)>
      forward_backward;
};

class PipelineExecutor {
 public:
  // Builds the plan's schedule for `microbatches`, inserts the communication
  // and checks the invariants, so a broken schedule fails before any op.
  static Result<PipelineExecutor> create(const Plan& plan, const Mesh& mesh, int rank);

  const schedule::Schedule& schedule() const { return schedule_; }
  int stage() const { return stage_; }

  // Runs this rank's actions in order. Activations and their gradients
  // between stages are shaped as compute.boundary says, of `dtype` (16-bit
  // under mixed precision). Under Plan::overlap_p2p_comm, on a backend that
  // times values rather than holds them (the sim), each receive runs on a
  // stream of its own (one for activations, one for gradients), posted where
  // Megatron posts it, as the compute action before the one that reads it
  // starts: the transfer runs under that compute once the peer sends, and
  // the reading compute waits only for its arrival. A backend that holds values receives
  // on the compute stream (the same values; posting a blocking receive ahead
  // of the compute its peer waits for would deadlock there).
  // The whole action list, or the part before its first backward action (a
  // GPipe schedule's forward half) or from it (the backward half).
  enum class Part { all, before_backward, from_backward };
  void run(Backend& b, const PipelineCompute& compute, DType dtype = DType::f32, Part part = Part::all);
  // Forward only (evaluation) of `microbatches`: every micro-batch j through
  // every local chunk, in (micro-batch, chunk) order, which needs no
  // schedule: each forward's input comes from a forward that is earlier in
  // its own rank's order.
  void run_forward(Backend& b, int microbatches, const PipelineCompute& compute, DType dtype = DType::f32);

 private:
  PipelineExecutor(schedule::Schedule s, std::vector<schedule::Pair> pairs, const Mesh& mesh, int rank);
  int peer(const schedule::Action& a) const;
  int tag(const schedule::Action& a, int microbatches) const;

  schedule::Schedule schedule_;
  // Plan::moe_a2a_overlap: this rank's pairs, (forward chunk, micro-batch, backward chunk, micro-batch).
  std::set<std::tuple<int, int, int, int>> pairs_;
  std::vector<int> stage_ranks_;  // global rank of each pipeline stage of this rank's pipeline
  int stage_ = 0;
  bool overlap_p2p_ = false;                   // Plan::overlap_p2p_comm
  std::array<std::optional<Stream>, 2> recv_;  // its receive streams: activations, gradients
};

}  // namespace meshtrain
