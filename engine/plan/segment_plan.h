// Plans made of segments (DESIGN.md, "Plans are sequences of segments").
//
// A segment is a contiguous range of the model's blocks with its own layout:
// the ranks it runs on, its tp, pp, dp, vpp, micro-batches, ZeRO stage,
// recomputation and sequence parallelism. A plan file gives them as
//
//   "segments": [
//     {"name": "patch embedding", "modules": ["embed"], "dp": 4},
//     {"modules": ["stage1", "stage2"], "tp": 2, "dp": 2},
//     {"modules": ["stage3", "stage4", "head"], "pp": 4, "microbatches": 4}
//   ]
//
// with blocks named by module (BlockDef::module: "embed", "stage1", ...,
// "head"; "embed", "encoder", "head"; ...) or by index ("blocks": [first,
// last], inclusive, block 0 being the model's first), and ranks as "ranks":
// [first, last] (inclusive; default: from 0, as many as tp·pp·dp). Each
// segment's Plan (Plan::segments) inherits the file's other fields
// (precision, global batch, sequence length, buckets) and defaults; its
// micro-batch is global batch / (dp · microbatches), microbatches defaulting
// to global batch / (dp · the plan's micro_batch).
//
// How segments meet (engine/step/training_engine.h): consecutive
// segments run on the same ranks (the second starts once the first's forward
// is done, the activations resharded by collectives of send/recv between
// the ranks that hold each sample) or on disjoint ranks (the second is a
// downstream pipeline stage of the first: it works on micro-batch k while
// the first works on k + 1). Every segment but the last runs its forward
// for all of its micro-batches first and its backward at the end of the
// iteration (a GPipe schedule); the last runs the plan's schedule.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backends/backend.h"
#include "core/status.h"
#include "engine/memory/memory_model.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"

namespace meshtrain {

// Ids of the process groups of segment k start at k · kGroupIdsPerSegment
// (Plan::group_id_base); the uniform mesh's at 0.
inline constexpr int kGroupIdsPerSegment = 1 << 20;

// The plan's segments: Plan::segments, or for a uniform plan the plan itself,
// a plan of one segment.
std::vector<Plan> plan_segments(const Plan& p);

// Every rank of `p`, as a group whose id no group of its segments (a
// uniform plan: its mesh) has: the boundaries' sums, the stop vote and the
// step timings go over it.
Group plan_world(const Plan& p);

// By rank: its place in the pipelines of `p`, one number for the ranks that
// hold the same stage of every segment (so the same layers and memory),
// numbered in order of first appearance: a uniform plan's is the rank's
// pipeline stage.
std::vector<int> pipeline_positions(const Plan& p);
// Who holds what rank `rank` holds, for a message about its memory: its
// pipeline stage's ranks in a uniform plan, in a plan made of segments the
// ranks at its pipeline position.
std::string position_holders(const Plan& p, int rank);

// What rank `rank` holds of every segment it is in (memory_model.h; the
// activations of all: a segment's forward activations wait for its backward
// at the iteration's end). A uniform plan: its stage's memory_per_rank.
MemoryBreakdown rank_memory(const ModelSpec& m, const Plan& p, int rank);

// A segment's blocks, by index in model_blocks order (0: the embedding).
struct BlockRange {
  int first = 0, last = 0;  // inclusive
};
BlockRange block_range(const Plan& segment, const ModelSpec& m);

// The segments of a plan file's "segments" list, each filled from `base`
// (the plan the file and the flags give) and placed on the model.
Result<std::vector<Plan>> segments_from_json(const nlohmann::json& list, const ModelSpec& m, const Plan& base);

// Checks a plan made of segments before anything runs: the segments cover
// the model's blocks in order without overlap, each divides (its heads,
// layers, ranks, batch), consecutive segments share their ranks or are
// disjoint, every rank of the world is used. Errors name the segment and the
// numbers. `world_size` 0: whatever the segments use.
Status validate_segments(const Plan& p, const ModelSpec& m, int world_size = 0);

// The layout as text: which ranks hold which blocks with which degrees
// (`meshtrain info --plan FILE`).
std::string describe_segments(const Plan& p, const ModelSpec& m);

// The model's blocks as "index module (hook index)" lines, for naming blocks in a plan.
std::string describe_blocks(const ModelSpec& m);

}  // namespace meshtrain
