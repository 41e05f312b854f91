// One Chrome trace from the parts of several ranks, each timed on its own
// clock: the pure half of `train --trace` under MPI (mpi_trace.h moves the
// parts; this file renders and joins them) and all of it with ranks as
// threads, whose clocks are one.
//
// A rank's part is rendered where its events are (render_rank_trace), with
// every timestamp moved onto the common time base by its ClockOffset
// (ts + offset_ns), then shipped as text (pack/unpack_fragments) and joined
// in rank order (merge_fragments): the file's layout is trace_recorder.h's,
// metadata first, then each rank's events in issue order, ranks ascending.
// A rank whose clock was estimated says so in its process_name metadata's
// args: "clock_offset_ns" (added to its times) and "clock_uncertainty_ns"
// (how far the estimate may be off, clock_offset_to_root).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "backends/comm/root_exchange.h"
#include "core/status.h"
#include "engine/tracing/trace_recorder.h"

namespace meshtrain {

// One rank's part, rendered: its metadata events and its op events, each a
// comma-separated run of JSON objects (no leading or trailing comma).
struct TraceFragment {
  int rank = 0;
  std::string metadata;
  std::string events;
};

// `estimated`: write the offset and its uncertainty into the metadata (ranks
// under MPI); else the clock is the common one and nothing is said.
TraceFragment render_rank_trace(int rank, const RankTrace& trace, const ClockOffset& clock, bool estimated);

// The whole trace file's text from every rank's fragment, ranks ascending.
std::string merge_fragments(std::vector<TraceFragment> fragments);

// render_rank_trace of each rank with its clock (a rank without one: offset
// 0, not estimated), then merge_fragments.
std::string merged_trace_json(const std::map<int, RankTrace>& ranks, const std::map<int, ClockOffset>& clocks);

// Fragments as one string to send, and back. unpack names what is malformed.
std::string pack_fragments(const std::vector<TraceFragment>& fragments);
Result<std::vector<TraceFragment>> unpack_fragments(std::string_view packed);

}  // namespace meshtrain
