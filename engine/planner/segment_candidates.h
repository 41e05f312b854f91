// Segment layouts for models made of several modules (a Swin's patch
// embedding and stages, a VQA model's vision encoder, projector and language
// model): plans whose two segments (engine/segments/segment_plan.h) each have
// their own degrees, searched beside the uniform plans.
//
// The family, for every cut between two consecutive modules (segment A the
// modules before it, B those after):
//  * same ranks: A and B each on all the GPUs, A with (tp, dp), B with
//    (tp, pp, dp), the activations resharded at the cut (the Swin per-stage
//    hybrid's kind);
//  * a pipeline boundary: A on the first a GPUs with (tp, dp), B on the other
//    gpus − a with (tp, pp, dp), B a downstream stage of A (the VQA job's
//    kind), for a = gpus/2 and, when they divide, gpus/4 and 3·gpus/4;
// tp a power of two up to a node, pp dividing B's ranks (at most one stage
// per body layer of B, and none in A, which runs before B), and both
// segments cut the global batch into the same number m of micro-batches per
// replica (1, 2, 4, 8, 16). Same-rank layouts equal to a uniform plan (same
// tp, pp 1) are left to the uniform search. Every segment runs ZeRO 0
// without recomputation or sequence parallelism: the family places modules,
// the uniform search tunes the rest.
//
// A plan is built from its plan-file "segments" list (segments_from_json),
// so what the planner times is what `train --plan` and `simulate --plan` read
// back; validate_plan judges it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/planner/search_space.h"

namespace meshtrain::planner {

struct SegmentCandidate {
  Plan plan;                // with plan.segments
  nlohmann::json segments;  // its plan-file "segments" list
};

struct SegmentEnumeration {
  std::vector<SegmentCandidate> valid;  // family order: cut, same ranks before boundaries, degrees ascending
  std::int64_t combinations = 0;
  std::optional<std::string> example_rejection;
};

// Whether the model has modules to place apart: an image model (ViT, Swin,
// VQA: a decoder's embedding, layers and head are one module's parts, which
// the uniform search places) of two or more modules, not tied across them (an
// embedding tied to the head must share a segment with it), not
// mixture-of-experts (one plan for the whole model).
bool has_segment_layouts(const ModelSpec& m);
// The family above for ctx (empty when !has_segment_layouts or one GPU).
SegmentEnumeration enumerate_segment_candidates(const SearchContext& ctx);

// "embed..stage2 tp 2 dp 2 | stage3..head tp 1 pp 2 dp 1 @2 m 4": each segment's
// modules and degrees, where it starts when on ranks of its own, and the micro-batches.
std::string describe_segments_short(const Plan& p);

}  // namespace meshtrain::planner
