// StepEngine: one rank's part of a training iteration.
//
// It owns the rank's model chunk(s), gradient buffers and AdamW state, and
// turns one iteration's micro-batches into forward and backward work, gradient
// clipping by global norm and the optimizer update, all as backend ops. The
// host waits only for the loss and the gradient norm at the end of the
// iteration (the progress line needs them; a NaN loss must stop the run
// before the update, so the parameters stay those of the last good step).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/mesh.h"
#include "engine/plan.h"
#include "models/gpt.h"

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

// One micro-batch of tokens on the host: ids and next-token targets, B·T each.
struct HostBatch {
  std::vector<std::int32_t> ids, targets;
  int batch = 0, seq = 0;
};

struct StepResult {
  double loss = 0;       // mean token loss over the global batch
  double grad_norm = 0;  // global L2 norm before clipping
};

class StepEngine {
 public:
  StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options);

  // Runs one iteration over this rank's micro-batches (plan.microbatches()
  // of them), with learning rate `lr` at 1-based optimizer step `step`.
  Result<StepResult> step(const std::vector<HostBatch>& microbatches, float lr, std::int64_t step);
  // Mean token loss over `batches` without updating anything.
  Result<double> evaluate(const std::vector<HostBatch>& batches);

  // The full (unsharded) parameters and AdamW moments by name ("params/<name>",
  // "adam_m/<name>", "adam_v/<name>"), for checkpoints and comparisons.
  Result<std::map<std::string, std::vector<float>>> export_state();
  // Loads what export_state produced; every name must be present with its size.
  Status import_state(const std::map<std::string, std::vector<float>>& state);

 private:
  MicroBatch upload(const HostBatch& h, std::uint64_t dropout_seed);
  Tensor run_microbatch(const MicroBatch& mb, float loss_scale);

  Backend& b_;
  ModelSpec m_;
  Plan plan_;
  StepOptions options_;
  std::unique_ptr<GptChunk> chunk_;
  Tensor adam_m_, adam_v_;  // like the flat parameters
  Tensor loss_total_;       // (1) Σ token losses of the iteration
  Tensor grad_sumsq_, clip_coef_;
};

}  // namespace meshtrain
