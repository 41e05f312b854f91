// The pass that turns a compute schedule into one a rank can execute: it adds
// the point-to-point sends and receives between neighbouring virtual stages.
//
// Execution model (the one dry_run checks): a send is buffered and never
// blocks; a receive blocks until its matching send has been issued. Under it
// the pass places
//   recv_act (c, j) right before forward (c, j)   unless s = 0
//   send_act (c, j) right after  forward (c, j)   unless s = V-1
//   recv_grad(c, j) right before backward (c, j)  unless s = V-1
//   send_grad(c, j) right after  backward (c, j)  unless s = 0
// Sending as early and receiving as late as the data allow can only remove
// waits, so the result deadlocks exactly when the compute order itself has a
// dependency cycle, which the builders' schedules do not. Neighbouring
// virtual stages on the same rank (p = 1) hand data over in memory and get no
// actions. A trainer that posts receives asynchronously may hoist them
// earlier; the wait belongs where the pass put it.
#pragma once

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

// Peer rank of a communication action (the rank of virtual stage s±1).
int peer_rank(const PipelineLayout& layout, const Action& a);

// The send that a receive waits for, or the receive that consumes a send.
Action matching_action(const PipelineLayout& layout, const Action& a);

// Input must hold compute actions only (an Error names the first that is not).
Result<Schedule> insert_communication(const Schedule& compute);

}  // namespace meshtrain::schedule
