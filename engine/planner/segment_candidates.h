// Segment layouts for models made of several modules (a Swin's patch
// embedding and stages, a VQA model's vision encoder, projector and language
// model): plans of two or three segments (engine/plan/segment_plan.h),
// each with its own degrees, searched beside the uniform plans.
//
// The family, for every way to cut the modules into 2 or 3 contiguous
// segments (3 only for models of at most 3 modules unless
// segments.count=3 asks: a Swin's 6 modules give 10 cuts of three):
//  * the segments' ranks: all on the same ranks (the Swin per-stage hybrid's
//    kind: activations resharded at each cut), or one pipeline boundary
//    (the VQA job's kind): the segments before it on the first a GPUs, those
//    after on the other gpus − a, for a = gpus/2 and, when they divide,
//    gpus/4 and 3·gpus/4 (two boundaries would give a segment a group of its
//    own, which the one-module segments here are too small to use);
//  * degrees per segment over its ranks: tp a power of two up to a node, pp
//    (the last segment only: the others run before it, GPipe-like) dividing
//    what is left, at most one stage per body layer, dp the rest;
//  * m micro-batches per replica, the same for every segment (1..16);
//  * per segment ZeRO 0-3 (dp > 1), recomputation none or full, sequence
//    parallelism off or on (tp > 1). ZeRO 2/3 and full recomputation only
//    save memory (the fast tier never makes them faster), so they are not
//    combined freely: each combination of ZeRO 0/1 and sp per segment starts
//    without them and, while its most loaded rank (the memory model summed
//    over the rank's segments) does not fit, the segment on that rank whose
//    next step saves the most there goes one step up its ladder (ZeRO 2,
//    ZeRO 3, full recomputation); a combination that runs out of steps is
//    pruned. Pins (segment_space.h) narrow or widen each choice.
// Same-rank layouts equal to a uniform plan (one tp, no pp) are left to the
// uniform search. --fix/--allow pin any of it (segment_space.h).
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

#include "engine/planner/memory_fit.h"
#include "engine/planner/search_space.h"
#include "engine/planner/segment_space.h"

namespace meshtrain::planner {

struct SegmentCandidate {
  Plan plan;                // with plan.segments
  nlohmann::json segments;  // its plan-file "segments" list
};

struct SegmentEnumeration {
  // Valid and not pruned by memory: family order (segments, cut, same ranks before boundaries, degrees ascending).
  std::vector<SegmentCandidate> valid;
  std::int64_t combinations = 0;  // every layout formed (degrees, micro-batches and per-segment choices)
  std::int64_t pruned = 0;        // valid, but over `device_bytes` with every memory step taken
  std::optional<std::string> example_rejection;
  // The valid layout needing the least memory, when none fits (for the error that says so).
  std::optional<SegmentCandidate> closest;
  double closest_bytes = 0;
};

// Whether the model has modules to place apart: an image model (ViT, Swin,
// VQA: a decoder's embedding, layers and head are one module's parts, which
// the uniform search places) of two or more modules, not tied across them (an
// embedding tied to the head must share a segment with it), not
// mixture-of-experts (one plan for the whole model).
bool has_segment_layouts(const ModelSpec& m);
// The family above for ctx within `space`, pruned by memory against
// `device_bytes` (empty when !has_segment_layouts or one GPU). Under
// precision fp8 each layout is formed without and with FP8 parameters (the
// whole plan's fp8_param_gather, every segment then under ZeRO 1-3), or only
// as `fp8_params` says where the uniform search's pins fix it.
SegmentEnumeration enumerate_segment_candidates(const SearchContext& ctx, const SegmentSpace& space,
                                                double device_bytes, std::optional<bool> fp8_params = std::nullopt);

// "embed..stage2 tp 2 dp 2 z1 | stage3..head tp 1 pp 2 dp 1 @2 rc sp m 4": each
// segment's modules, degrees and choices (z ZeRO stage, rc full recomputation,
// sp), where it starts when on ranks of its own, and the micro-batches.
std::string describe_segments_short(const Plan& p);

}  // namespace meshtrain::planner
