// A dry run executes a schedule with no data: all ranks advance in lockstep
// steps, each running at most its next action per step.
//   - a send is buffered: it completes at once, visible to its peer from the
//     next step on;
//   - a receive blocks until its matching send has been issued;
//   - a compute action must find its inputs already there (received, or
//     computed earlier on this rank when the neighbouring stage is local), and
//     a send must find the compute whose data it carries already done.
//     Nothing later in the row could supply them, so a violation is an Error
//     at once, not a wait.
// A step in which no rank can move while some have actions left is a
// deadlock. Its Error names, for each stuck rank, the receive it waits at
// and the send it waits for, then prints the step × rank grid: each executed
// action in the column of its step, '.' where the rank waited, and the stuck
// actions in brackets in the last column:
//   step:   0  stuck
//   rank 0: F0 [RG0]
//   rank 1: .  [RA0]
// Sends no one received by the end are an Error too.
#pragma once

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

Status dry_run(const Schedule& schedule);

}  // namespace meshtrain::schedule
