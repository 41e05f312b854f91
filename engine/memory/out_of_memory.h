// The one "out of memory" message, for every place a run is refused or fails
// for memory (simulate, the default-plan check, the planner, cpu training):
// it names the rank, its estimated peak against the capacity that binds it,
// and its largest consumer, the part to shrink first (issue 29).
#pragma once

#include <string>
#include <vector>

#include "engine/memory/memory_model.h"

namespace meshtrain {

struct MemoryConsumer {
  std::string name;  // "optimizer state": what the message calls it
  double bytes = 0;
};

// The device parts of a breakdown, named, in MemoryBreakdown's order (so a
// tie goes to the earlier one); parts of no bytes are left out.
std::vector<MemoryConsumer> memory_consumers(const MemoryBreakdown& m);

// The largest of `consumers` (the first of equals); {"nothing", 0} when empty.
MemoryConsumer largest_consumer(const std::vector<MemoryConsumer>& consumers);

struct OutOfMemory {
  int rank = 0;
  std::string where;      // "pipeline stage 0, and every tp rank ...": who else peaks alike (may be empty)
  double peak = 0;        // the rank's estimated peak, bytes
  double capacity = 0;    // bytes
  std::string capacity_of = "the device";  // whose capacity: "the device", "this machine"
  // Ranks that share the capacity (rank threads of one process): their
  // number and the bytes all of them need together. 1: the rank is alone.
  int sharing_ranks = 1;
  double shared_total = 0;
  std::vector<MemoryConsumer> consumers;  // of the rank's peak
  std::string detail;  // more figures for the reader (e.g. micro-batches in flight); may be empty
  std::string fix;     // what to try
};

// "out of memory: rank 0 (pipeline stage 0) peaks at an estimated 1.2 TiB
// against the device's capacity of 141 GiB; its largest consumer is the
// optimizer state (938 GiB). Breakdown: parameters ..., ...; <detail>. <fix>"
std::string out_of_memory_message(const OutOfMemory& o);

}  // namespace meshtrain
