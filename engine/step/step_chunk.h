// Internal to the step engine: included by step_engine.cc and
// step_engine_state.cc only, which both work on a rank's model chunks. Other
// code sees StepEngine through step_engine.h, where Chunk stays opaque.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/parallel/gradient_buckets.h"
#include "engine/parallel/parameter_gather.h"
#include "engine/parallel/sharded_optimizer.h"
#include "engine/step/fp8_training.h"
#include "engine/step/step_engine.h"

namespace meshtrain {

struct StepEngine::Chunk {
  int virtual_stage = 0;
  std::unique_ptr<ModelChunk> model;
  std::unique_ptr<GradientBuckets> buckets;
  std::unique_ptr<ParameterGather> gather;  // ZeRO-3 only
  std::unique_ptr<ShardedAdamW> adam;
  std::unique_ptr<Fp8Scaling> fp8;  // under precision fp8
  std::vector<SavedActivations> saved;  // by micro-batch, between its forward and backward
  // By micro-batch, between its backward and its weight pass (zero-bubble schedules).
  std::vector<std::vector<std::function<void()>>> weights;
  // Plan::overlap_update: by gradient bucket, the end of its update (and all-gather) on the
  // data-parallel stream, until the compute stream has waited for it.
  std::vector<Event> updated;
};

}  // namespace meshtrain
