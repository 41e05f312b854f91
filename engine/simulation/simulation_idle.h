// The compute stream's idle time of a simulated iteration by its cause.
//
// The executor charges every gap of a stream to what it waited for
// (simulator/executor.h, "Idle by cause"); here those waits become the
// causes a user acts on:
//   pipeline bubble   waiting for a pipeline neighbour (a send/recv on the
//                     compute stream, or a receive posted ahead on a
//                     "pipeline recv" stream under overlap_p2p_comm), or with
//                     nothing left to run while other stages finish (fill
//                     and drain)
//   data-parallel     waiting for the data-parallel stream's collectives:
//                     gradient reduce-scatter / all-reduce, parameter
//                     all-gather (ZeRO), exposed because backward or the
//                     next forward had nothing else to do
//   model-parallel    waiting for tensor-, context- or expert-parallel
//                     communication on a side stream, or for the other
//                     members of a collective issued on the compute stream
//   optimizer         waiting for optimizer kernels on another stream (the
//                     data-parallel stream's AdamW, norm and casts; offload)
//   other             anything else (e.g. waiting on another compute stream)
// Communication issued on the compute stream itself is not idle time: it is
// the "exposed comm" figure (simulation.h).
#pragma once

#include <vector>

#include "simulator/executor.h"

namespace meshtrain {

struct IdleBreakdown {
  double pipeline_s = 0, data_parallel_s = 0, model_parallel_s = 0, optimizer_s = 0, other_s = 0;
  // Of model_parallel_s, the waits for the expert-parallel stream's token all-to-alls (EP all-to-all
  // overlap, Plan::moe_a2a_overlap); not a cause of its own in total().
  double expert_parallel_s = 0;
  double total() const { return pipeline_s + data_parallel_s + model_parallel_s + optimizer_s + other_s; }
  IdleBreakdown& operator+=(const IdleBreakdown& o);
  IdleBreakdown scaled(double k) const;
};

// The causes the executor reported for a stream, classified as above by the
// engine's stream names ("data-parallel", "tensor-parallel", "context-parallel",
// "expert-parallel", "offload-*", "pipeline recv *").
IdleBreakdown classify_idle(const std::vector<sim::IdleCause>& causes);

// `two`'s causes minus `one`'s, cause by cause (steady state: the second of
// two iterations).
std::vector<sim::IdleCause> subtract_idle(std::vector<sim::IdleCause> two, const std::vector<sim::IdleCause>& one);

}  // namespace meshtrain
