// What the training loop, the simulator and the tests drive: one rank's
// engine for a whole plan. A uniform plan is one StepEngine
// (engine/step/step_engine.h); a plan made of segments is a SegmentedEngine
// (engine/step/segmented_engine.h), several StepEngines sharing one
// iteration. They differ in what data a rank feeds them (DataShare).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/plan/plan.h"
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
  virtual ~TrainingEngine() = default;
  virtual DataShare data_share() const = 0;
  // One iteration over this rank's DataShare of the global batch; collective over every rank.
  virtual Result<StepResult> step(const std::vector<HostBatch>& microbatches, float lr, std::int64_t step) = 0;
  // Loss and top-1 accuracy over held-out `batches` (this rank's share of them, as the loader gives it).
  virtual Result<Evaluation> evaluate_metrics(const std::vector<HostBatch>& batches) = 0;
  // The full parameters and AdamW moments by name (StepEngine::export_state), on every rank.
  virtual Result<std::map<std::string, std::vector<float>>> export_state() = 0;
  virtual Status import_state(const std::map<std::string, std::vector<float>>& state) = 0;
  // This rank's own plan-dependent state (StepEngine::export_rank_state: 1bit
  // error feedback), which the checkpoint keeps per rank. Not collective.
  virtual Result<std::vector<float>> export_rank_state() = 0;
  virtual Status import_rank_state(std::span<const float> state) = 0;
};

// The engine of rank b.rank() for plan `p` (uniform or made of segments).
std::unique_ptr<TrainingEngine> make_engine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options);

}  // namespace meshtrain
