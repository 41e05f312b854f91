// Chrome trace event format output (open in Perfetto or chrome://tracing).
//
// One process per device (pid = device id, named "gpu N"), one thread per
// stream (tid = the stream's index on its device, named by the stream).
// Tasks are complete events ("ph":"X"); a send/recv pair is also drawn as a
// flow arrow ("ph":"s" on the sender at the transfer's start, "ph":"f" on the
// receiver at its end, "bp":"e"). A stream's idle gaps are async slices
// ("ph":"b" and "e", category "idle", named by their cause), which Perfetto
// draws on a track of their own and readers of complete events skip. Timestamps are microseconds printed from
// integer picoseconds with six decimals, and events are written in the order
// they were added after the metadata, so identical input gives identical
// bytes.
//
// Format reference: "Trace Event Format" (Google, the catapult project).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "simulator/event_queue.h"
#include "simulator/name_table.h"

namespace meshtrain::sim {

class Trace {
 public:
  void name_process(int pid, std::string_view name);
  void name_thread(int pid, int tid, std::string_view name);
  void complete(int pid, int tid, std::string_view name, std::string_view category, Time start,
                Time duration);
  void flow_start(int pid, int tid, uint64_t id, Time at);
  void flow_end(int pid, int tid, uint64_t id, Time at);
  void idle(int pid, int tid, std::string_view cause, Time start, Time duration);

  size_t size() const { return events_.size(); }
  std::string to_json() const;
  Status write(const std::string& path) const;

 private:
  enum class Ph : uint8_t { kComplete, kFlowStart, kFlowEnd, kIdle };
  struct Event {
    Ph ph;
    int32_t pid, tid;
    NameId name, category;
    Time start, duration;
    uint64_t id;
  };
  struct Meta {
    int32_t pid, tid;  // tid -1: process name
    NameId name;
  };
  NameTable names_;
  std::vector<Meta> meta_;
  std::vector<Event> events_;
};

}  // namespace meshtrain::sim
