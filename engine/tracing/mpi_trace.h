// `train --trace FILE` under MPI: one file of every rank, written by rank 0.
// Each process times its clock against rank 0's (clock_offset_to_root),
// renders its ranks' events on rank 0's time base and sends them to rank 0
// (gather_to_root), which merges them in rank order (trace_merge.h) and
// writes FILE atomically (write_output_file). No other process writes.
#pragma once

#include <chrono>
#include <string>

#include "backends/comm/mpi_environment.h"
#include "core/status.h"
#include "engine/tracing/trace_recorder.h"

namespace meshtrain {

// Every process calls it once its ranks are done, a failed one too (a trace
// of a failed run shows where it failed). A process that does not take part
// within `timeout` is left out: rank 0 still writes the others and returns
// an error naming the ranks missing. `outgoing` holds what this process
// sends; the caller keeps it alive until it has ended the job on an error
// (gather_to_root).
Status write_mpi_trace(const MpiEnvironment& env, const TraceRecorder& recorder, const std::string& path,
                       std::chrono::milliseconds timeout, std::string& outgoing);

}  // namespace meshtrain
