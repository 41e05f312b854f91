// Timed exchanges between every process of an MPI job and rank 0, for what a
// job gathers once at its end (`train --trace`'s one trace of every rank,
// engine/tracing/mpi_trace.h): each process's clock against rank 0's, and a
// byte string from each process to rank 0.
//
// They run over MPI_COMM_WORLD with tags of their own (every communicator of
// the backends works on a duplicate of it, so nothing else matches them) and
// without a collective call, so a process that never arrives costs its peers
// `timeout`, not a hang. Waiting polls MPI_Test, as MpiCommunicator does.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/comm/mpi_environment.h"
#include "core/status.h"

namespace meshtrain {

// Rank 0's clock minus this process's, estimated NTP-style: this process
// sends its time t1, rank 0 answers with its time t0, the answer arrives at t2;
// rank 0 read t0 somewhere in [t1, t2], so offset = t0 - (t1 + t2) / 2 is
// within (t2 - t1) / 2 of the truth. Of several rounds the one with the
// shortest round trip is kept. On rank 0: {0, 0}.
struct ClockOffset {
  std::int64_t offset_ns = 0;
  std::int64_t uncertainty_ns = 0;  // half the kept round trip
};

// Every process calls it with its own clock (nanoseconds, any origin, never
// going backwards); rank 0 answers the others in rank order.
Result<ClockOffset> clock_offset_to_root(const MpiEnvironment& env, const std::function<std::int64_t()>& clock,
                                         std::chrono::milliseconds timeout);

// Every process calls it. On rank 0: the strings of all processes, by rank
// (its own `mine` at 0); a process that did not send within `timeout` has
// nullopt. On the others: an empty vector once rank 0 has taken `mine`.
// After a timeout a send may still read `mine`, so the caller keeps it alive
// until it ends the job (abort_job).
Result<std::vector<std::optional<std::string>>> gather_to_root(const MpiEnvironment& env, const std::string& mine,
                                                                std::chrono::milliseconds timeout);

}  // namespace meshtrain
