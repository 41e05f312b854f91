// The schedule of EP all-to-all overlap (Megatron-Core's combined 1F1B,
// --overlap-moe-expert-parallel-comm): in the steady state each forward of a
// micro-batch runs interleaved with the backward of an earlier one, layer by
// layer, so that one pass's token all-to-alls hide under the other's compute
// (engine/step/step_engine.h, models/moe_layer.h). Two passes make a 1F1B or
// interleaved schedule into one:
//   pair_forward_backward(compute): every rank runs one warm-up forward more
//     (Megatron's num_warmup_microbatches + 1, so that the forward and the
//     backward of a pair are independent): each backward that a forward
//     directly follows trades places with it, and the two make a pair. A row
//     with no steady state (all forwards first) has no pairs, although its
//     last forward may be followed by its first backward.
//   hoist_pair_communication(full, pairs), after insert_communication: a pair
//     runs as one pass, so the backward's gradient is received before the
//     forward starts and the forward's activation is sent after the backward
//     ends.
// Both keep every (stage, micro-batch) and its neighbours' order of data, so
// check_invariants and dry_run hold for the result as for the input.
#pragma once

#include <vector>

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

// A forward and the backward that runs interleaved with it.
struct Pair {
  Action forward, backward;
  bool operator==(const Pair&) const = default;
};

struct PairedSchedule {
  Schedule compute;
  std::vector<Pair> pairs;  // every rank's, in row order
};

PairedSchedule pair_forward_backward(const Schedule& compute);
Schedule hoist_pair_communication(const Schedule& full, const std::vector<Pair>& pairs);

}  // namespace meshtrain::schedule
