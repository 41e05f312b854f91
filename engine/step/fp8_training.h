// Precision fp8 run by the step engine: the FP8 scaling of
// models/fp8_linear.h, trained as exact emulation on the cpu backend
// (StepOptions::emulate_fp8) and costed on the sim backend.
//
// Per step under delayed scaling (Transformer Engine's and Megatron's amax
// reduction): each
// chunk's FP8 tensors record their amax over the step's micro-batches; at the
// end of the step the amax are all-reduced (max) over every rank that holds
// part of a tensor, the tensor-parallel group (weight shards, the
// row-parallel inputs, the column-parallel gradients) and the replicas (data
// and context parallel: other samples and other tokens), Megatron's
// DP x TP x CP amax reduction group (which, the whole stage, also holds every
// expert-parallel and expert-data-parallel rank of a routed experts' grouped
// tensor), then folded into the histories. Max is
// exact in any order, so every rank, and the single-rank run, gets the same
// bits, and step t's scales depend only on steps before t. A pipeline stage
// owns its layers' histories (no reduction over pp), and so does a segment of
// a plan made of segments: it reduces over its own tp, dp and cp groups, with
// one read per segment a rank is in.
//
// Checkpoints keep each FP8 linear's state as tensor "fp8/<linear>" (3 x
// [scale, amax history oldest first]), so a resumed run continues bit for bit.
//
// Current scaling (Fp8Recipe::current) reduces each cast's amax where it casts
// (models/fp8_linear.h) and keeps no state: no step-end reduction, no
// checkpoint tensors.
#pragma once

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "models/fp8_linear.h"
#include "models/model_spec.h"

namespace meshtrain {

// Whether the cpu backend can train plan `p` of model `m` in fp8 as exact
// emulation: under current scaling a routed experts' grouped GEMM casts the
// rows its experts receive with one scale, so they must come from one
// micro-batch, which holds when each expert group lies within the ranks that
// share one (tensor and context parallel). An Error names the numbers and
// the fixes otherwise.
Status check_fp8_emulation(const ModelSpec& m, const Plan& p);

// Reduces the step's amax of `chunks` (max over each of `groups` in turn) and
// folds them into their histories. Collective over the groups; reads once.
Status fold_fp8_amax(Backend& b, std::span<Fp8Scaling* const> chunks, std::span<const Group* const> groups);

// The checkpoint tensor of one FP8 linear's scaling state.
std::string fp8_state_name(const std::string& linear);
// The checkpoint tensors, with their sizes, of the FP8 scaling state of the
// layers plan (or segment) `p` holds; none unless the plan trains in fp8.
std::vector<std::pair<std::string, std::int64_t>> fp8_state_sizes(const ModelSpec& m, const Plan& p);

// Adds the scaling state of `chunks` to `out`, and under pipeline parallelism
// every stage's (broadcast from the stage that owns the layer), so that each
// rank returns the whole model's. Collective over the pipeline group.
Status export_fp8_state(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh,
                        std::span<Fp8Scaling* const> chunks, std::map<std::string, std::vector<float>>& out);
// Restores the state of `chunks`' linears from `state` (what export_fp8_state wrote).
Status import_fp8_state(std::span<Fp8Scaling* const> chunks, const std::map<std::string, std::vector<float>>& state);

}  // namespace meshtrain
