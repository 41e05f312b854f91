// Static checks of a schedule and the in-flight count that sizes activation
// memory. dry_run.h checks what only execution shows (deadlock, causality).
#pragma once

#include <vector>

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

// One row per rank, every action on its own rank's row and inside the
// layout: what every consumer of a schedule (dry run, timing, trainer) needs
// before it may index by stage, chunk and microbatch.
Status check_rows(const Schedule& schedule);

// The invariants of a schedule after insert_communication; the first
// violation is the Error:
//  - check_rows;
//  - every (virtual stage, microbatch) is forwarded exactly once and backwarded
//    exactly once, the backward after the forward;
//  - the forward of s > 0 is preceded by the receive of its activation and
//    the backward of s < V-1 by the receive of its gradient; the forward of
//    s < V-1 is followed by the send of its activation and the backward of
//    s > 0 by the send of its gradient. With those, and receives that wait
//    for their sends (dry_run), forward s follows forward s-1 and backward s
//    follows backward s+1 of the same microbatch. When s and its neighbour
//    share a rank (p = 1) the neighbour's compute must come first in the row;
//  - every send has exactly one matching receive and every receive one send.
Status check_invariants(const Schedule& schedule);

// Microbatches forwarded and not yet backwarded, at their peak, walking each
// rank's row in order (communication actions ignored). Expects a schedule
// that passes check_rows.
struct InFlight {
  std::vector<int> per_rank;                // [r]: all chunks of rank r together
  std::vector<std::vector<int>> per_chunk;  // [r][c]
};
InFlight peak_in_flight(const Schedule& schedule);

}  // namespace meshtrain::schedule
