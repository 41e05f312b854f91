// StepEngine: one rank's part of a training iteration under any hybrid plan.
//
// It owns the rank's model chunk(s) (vpp of them, virtual stages c·pp + stage,
// each with Megatron tensor parallelism inside), gradient buckets and AdamW
// state, and turns one iteration's micro-batches into the pipeline schedule's
// forward and backward work (engine/parallel/pipeline_executor.h), the
// data-parallel gradient reduction in buckets overlapped with backward or
// after it (Plan::grad_bucket_mb and grad_sync; gradient_buckets.h), ZeRO
// sharding of the optimizer state (sharded_optimizer.h), of the gradients (stage 2: a layer's gradient lives
// only while backward works on it) and of the parameters (stage 3, gathered
// layer by layer with prefetch: parameter_gather.h), gradient clipping by global norm and the update, all
// as backend ops. The host waits only for the loss and the gradient norm at
// the end of the iteration (the progress line needs them; a NaN loss must stop
// the run before the update, so the parameters stay those of the last good
// step). Errors of any collective on the way (a timeout names op, group and
// peers) surface there, as the Status of step().
//
// Every rank of the mesh constructs a StepEngine and calls each method the
// same number of times in the same order: they are collective.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/mesh.h"
#include "engine/parallel/pipeline_executor.h"
#include "engine/plan.h"
#include "models/model_chunk.h"

namespace meshtrain {

struct OptimizerOptions {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // on matrices only (ParamInfo::weight_decay)
  float max_grad_norm = 1.0f; // <= 0: no clipping
};

struct StepOptions {
  OptimizerOptions optimizer;
  float dropout = 0.f;
  std::uint64_t seed = 1234;  // initialisation and dropout
  // false: leave parameter values as the backend allocated them. The sim
  // backend holds no data, and the host-side init loop over every element
  // would dominate simulating a 100B+ model.
  bool initialize_parameters = true;
};

// One micro-batch on the host. A language model reads ids and next-token
// targets (B·T each); a vision model reads pixels (B, H, W, channels),
// normalised, and one class label per image in targets (B), with seq the
// model's tokens per image (ModelSpec::seq_len); a VQA model reads pixels,
// each sample's question in ids (B·Q, left-padded) and its answer word in
// targets (B), with seq its decoder's tokens (ModelSpec::seq_len).
struct HostBatch {
  std::vector<std::int32_t> ids, targets;
  std::vector<float> pixels;
  int batch = 0, seq = 0;
};

// A micro-batch of `micro_batch` samples of synthetic data shaped for model
// `m` (token ids, or blank images and labels), for timing and simulation.
HostBatch example_batch(const ModelSpec& m, int micro_batch, int seq);

struct StepResult {
  double loss = 0;       // mean loss over the global batch's targets (tokens or images)
  double grad_norm = 0;  // global L2 norm before clipping
};

struct Evaluation {
  double loss = 0;      // mean loss over every target of the batches
  double accuracy = 0;  // share of targets whose logit is the largest (top-1)
};

class StepEngine {
 public:
  StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options);
  ~StepEngine();

  // Whether this engine can run plan `p` (on top of validate_plan): an Error
  // names what it cannot do. A StepEngine built for such a plan returns the
  // same Error from every method.
  static Status supports(const Plan& p);

  // Runs one iteration over this rank's micro-batches, with learning rate
  // `lr` at 1-based optimizer step `step`. A rank receives its data-parallel
  // replica's share of the global batch: plan.microbatches() micro-batches of
  // plan.micro_batch sequences, replica d (Coord::dp) getting global
  // micro-batches [d·m, (d+1)·m). Every rank of one replica (its tensor- and
  // pipeline-parallel peers) receives the same ones. The objective is the mean
  // token loss over the global batch; the result is the same on every rank.
  Result<StepResult> step(const std::vector<HostBatch>& microbatches, float lr, std::int64_t step);
  // Mean loss over `batches` without updating anything: each replica
  // passes its own batches (same rule as step), the mean is over all of them.
  Result<double> evaluate(const std::vector<HostBatch>& batches);
  // The same, with the top-1 accuracy.
  Result<Evaluation> evaluate_metrics(const std::vector<HostBatch>& batches);

  // The full (unsharded) parameters and AdamW moments by name ("params/<name>",
  // "adam_m/<name>", "adam_v/<name>"), for checkpoints and comparisons.
  // Gathered over tensor-parallel shards, pipeline stages and ZeRO shards, so
  // the content does not depend on the plan; every rank returns all of it.
  Result<std::map<std::string, std::vector<float>>> export_state();
  // Loads what export_state produced (under any plan); every name must be
  // present with its full size. Each rank keeps its own shards.
  Status import_state(const std::map<std::string, std::vector<float>>& state);

 private:
  struct Chunk;
  MicroBatch upload(const HostBatch& h, std::uint64_t dropout_seed);
  // Checks a micro-batch against the model: its size, and under sequence
  // parallelism that tp divides the rows at every block.
  Status check_batch(const HostBatch& h) const;
  // What chunk c's neighbours send it for `mbs[j]` (PipelineCompute::boundary).
  std::function<Shape(int, int, bool)> boundaries(const std::vector<MicroBatch>& mbs) const;
  bool counts_in_norm(const Chunk& c, const ParamSlot& slot) const;
  Status all_reduce_tied_embedding();

  Backend& b_;
  ModelSpec m_;
  Plan plan_;
  Mesh mesh_;
  StepOptions options_;
  Coord coord_;
  Stream compute_, comm_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // local chunk c: virtual stage c·pp + stage
  std::unique_ptr<PipelineExecutor> pipeline_;
  Tensor loss_total_;  // (1) Σ token losses of the iteration on this rank
  Tensor grad_sumsq_, clip_coef_;
  std::optional<Error> setup_error_;
};

}  // namespace meshtrain
