// The shapes a workload's training step issues, for `meshtrain calibrate
// --workload MODEL:B:T` to measure: found by running the step itself (one
// iteration of the StepEngine, under tensor parallelism 1 and 2, on the sim
// backend, which issues every op without computing anything) through a
// recorder that keeps each GEMM's (m, n, k, transposes), each grouped GEMM's
// (experts, rows per expert, n, k), each attention's
// shape and each measured memory-bound op's (rows, cols). Whatever blocks a
// model has, its calibration then covers the shapes its step runs.
#pragma once

#include <cstdint>
#include <set>

#include "core/status.h"
#include "engine/calibrate/measure.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"

namespace meshtrain::calibrate {

struct WorkloadShapes {
  std::set<GemmShape> gemm;
  std::set<GroupedGemmShape> grouped;  // an MoE model's experts
  std::set<AttentionShape> attention;
  std::set<OpShape> ops;
};

// Adds the shapes of one step of `micro_batch` samples of `seq` tokens (the
// model's own for images) at `precision` under tp 1 and, where the model
// splits, tp 2, each with the dtypes that step gives its tensors.
Status record_workload_shapes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq, Precision precision,
                              WorkloadShapes& out);

}  // namespace meshtrain::calibrate
