// TraceRecorder: the events of a real run, collected from every rank of this
// process and written as a Chrome trace event file (open in Perfetto or
// chrome://tracing), in the layout the simulator writes (simulator/trace.h):
//
//   {"displayTimeUnit":"ns","traceEvents":[
//   {"ph":"M","pid":R,"name":"process_name","args":{"name":"rank R (cpu)"}},   one per rank
//   {"ph":"M","pid":R,"tid":S,"name":"thread_name","args":{"name":"compute"}}, one per stream
//   {"ph":"X","pid":R,"tid":S,"name":"gemm","cat":"compute","ts":..,"dur":..,"args":{..}},
//   ...]}
//
// pid is the global rank, tid the backend's Stream id, named by the name given
// to create_stream (stream 0: "compute"). Ops are complete events ("X");
// collectives are named and categorised as the simulator names them
// ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"),
// point to point as "send" / "recv". Timestamps are microseconds since the
// recorder was made, printed from integer nanoseconds with three decimals;
// under MPI, since rank 0's recorder was made (trace_merge.h, mpi_trace.h).
// An event timed on the device (TraceEvent::device_clock) says so in its args,
// "clock":"device"; its times are on the host's time base all the same.
// Metadata come first, then each rank's events in issue order, ranks
// ascending, so a file reads rank by rank.
//
// Engine code does not use simulator/trace.h itself: the engine depends on
// backends/backend.h and models/ only (DESIGN.md), and the simulator's Trace
// has no per-event args. This file mirrors its format instead.
//
// Threads: with ranks as threads, every rank's TracingBackend hands its
// events over from its own thread (add_rank); `mu_` serialises that. Writing
// is for after the ranks are done.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain {

struct ClockOffset;  // backends/comm/root_exchange.h

struct TraceEvent {
  int stream = 0;             // tid
  const char* name = "";      // op name, a string literal
  const char* category = "";  // "compute", "host", a collective's name, "send" or "recv"
  std::int64_t start_ns = 0;  // since the recorder's origin
  std::int64_t duration_ns = 0;
  // start and duration measured on the device (TracingBackend), written with
  // "clock":"device" in the event's args; else the host clock's.
  bool device_clock = false;
  // The event's args, a rendered JSON object ("{...}"), as [begin, begin +
  // size) of its RankTrace's `args`; size 0: none.
  std::size_t args_begin = 0, args_size = 0;
};

// One rank's part of the trace.
struct RankTrace {
  std::string label;                   // process name, "rank 3 (cpu)"
  std::map<int, std::string> streams;  // Stream id -> name
  std::vector<TraceEvent> events;      // issue order
  // Every event's args back to back. One growing buffer rather than a small
  // string per event: small allocations that live for the whole run, made
  // between the step's large tensor allocations, fragment glibc's heap (a
  // 40k-event run grew by 170 MB that way instead of by 4 MB).
  std::string args;

  void add(TraceEvent e, std::string_view event_args);
};

class TraceRecorder {
 public:
  TraceRecorder() : origin_(std::chrono::steady_clock::now()) {}
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Nanoseconds since this recorder was made (steady clock), the time base of
  // every event. Thread-safe (reads only the constant origin).
  std::int64_t now_ns() const;

  // Adds (or, for a rank seen before, appends to) rank `rank`'s events.
  // Thread-safe.
  void add_rank(int rank, RankTrace trace);

  std::string to_json() const;
  // This process's ranks, their times moved by `clock` (trace_merge.h's
  // fragments, packed), for rank 0 to merge.
  std::string packed_fragments(const ClockOffset& clock) const;
  // Writes to_json() to `path`, replacing the file.
  Status write(const std::string& path) const;

  // Fails, naming the path, when `path` cannot be created or written, so a run
  // is refused before it starts rather than losing its trace at the end.
  // Leaves an empty file behind that write() later replaces.
  static Status probe(const std::string& path);

 private:
  const std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;         // guards ranks_
  std::map<int, RankTrace> ranks_;  // by global rank
};

}  // namespace meshtrain
