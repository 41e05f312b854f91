#include "backends/comm/root_exchange.h"

#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <span>
#include <limits>
#include <thread>

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

// Tags of their own on MPI_COMM_WORLD (at most 32767, MPI_TAG_UB's least value).
constexpr int kClockTag = 32101;
constexpr int kSizeTag = 32102;
constexpr int kDataTag = 32103;
// Round trips per process; the shortest bounds the offset best.
constexpr int kClockRounds = 16;
// A message's count is an int: larger strings go in chunks.
constexpr std::size_t kChunk = std::size_t{1} << 30;

double seconds(std::chrono::milliseconds t) { return std::chrono::duration<double>(t).count(); }

// Polls `requests` until all are complete (true) or `deadline` passes
// (false). `spin`: yield between tests rather than sleep, for the clock
// exchange, whose round trips a sleep would lengthen.
Result<bool> wait_all(std::vector<MPI_Request>& requests, Clock::time_point deadline, bool spin) {
  for (;;) {
    int done = 0;
    if (int e = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
        e != MPI_SUCCESS)
      return make_error("MPI_Testall failed: {}", mpi_error_text(e));
    if (done) return true;
    if (Clock::now() >= deadline) return false;
    if (spin) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Cancels what is still pending (a peer that never came), so MPI holds no
// request of ours after we return.
void cancel_pending(std::span<MPI_Request> requests) {
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

// One message to or from `peer`, waited for until `deadline`.
Result<bool> exchange(void* data, int bytes, int peer, int tag, bool send, Clock::time_point deadline) {
  std::vector<MPI_Request> r(1, MPI_REQUEST_NULL);
  const int e = send ? MPI_Isend(data, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r.data())
                     : MPI_Irecv(data, bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r.data());
  if (e != MPI_SUCCESS) return make_error("{} failed: {}", send ? "MPI_Isend" : "MPI_Irecv", mpi_error_text(e));
  MT_ASSIGN(const bool done, wait_all(r, deadline, true));
  if (!done) cancel_pending(r);
  return done;
}

Status serve_clock(const MpiEnvironment& env, const std::function<std::int64_t()>& clock,
                   std::chrono::milliseconds timeout) {
  std::vector<int> missing;
  for (int peer = 1; peer < env.world_size(); ++peer) {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (int round = 0; round < kClockRounds; ++round) {
      std::int64_t t = 0;
      MT_ASSIGN(bool done, exchange(&t, sizeof t, peer, kClockTag, false, deadline));
      if (done) {
        t = clock();
        MT_ASSIGN(done, exchange(&t, sizeof t, peer, kClockTag, true, deadline));
      }
      if (!done) {
        missing.push_back(peer);
        break;
      }
    }
  }
  if (missing.empty()) return ok_status();
  return make_error("rank 0: rank {} did not time its clock against rank 0's within {:g} s",
                    fmt::join(missing, ", "), seconds(timeout));
}

}  // namespace

Result<ClockOffset> clock_offset_to_root(const MpiEnvironment& env, const std::function<std::int64_t()>& clock,
                                         std::chrono::milliseconds timeout) {
  if (env.rank() == 0) {
    MT_TRY(serve_clock(env, clock, timeout));
    return ClockOffset{};
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  ClockOffset best{0, std::numeric_limits<std::int64_t>::max()};
  for (int round = 0; round < kClockRounds; ++round) {
    std::int64_t t = clock();
    const std::int64_t t1 = t;
    MT_ASSIGN(bool done, exchange(&t, sizeof t, 0, kClockTag, true, deadline));
    if (done) {
      MT_ASSIGN(done, exchange(&t, sizeof t, 0, kClockTag, false, deadline));
    }
    if (!done)
      return make_error("rank {}: rank 0 did not answer the trace's clock exchange within {:g} s", env.rank(),
                        seconds(timeout));
    const std::int64_t t2 = clock();
    const std::int64_t half_trip = (t2 - t1 + 1) / 2;
    if (half_trip < best.uncertainty_ns) best = {t - (t1 + (t2 - t1) / 2), half_trip};
  }
  return best;
}

namespace {

// Rank 0's side: every peer's size, then its bytes as they come; peers are
// taken in any order, so one that never comes delays the others by nothing.
Result<std::vector<std::optional<std::string>>> receive_all(const MpiEnvironment& env, const std::string& mine,
                                                            std::chrono::milliseconds timeout) {
  const int world = env.world_size();
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(world), 0);
  std::vector<std::string> bytes(static_cast<std::size_t>(world));
  std::vector<MPI_Request> size_req(static_cast<std::size_t>(world), MPI_REQUEST_NULL);
  std::vector<std::vector<MPI_Request>> data_req(static_cast<std::size_t>(world));
  std::vector<bool> posted(static_cast<std::size_t>(world), false);
  for (int p = 1; p < world; ++p)
    if (int e = MPI_Irecv(&sizes[p], sizeof(std::uint64_t), MPI_BYTE, p, kSizeTag, MPI_COMM_WORLD, &size_req[p]);
        e != MPI_SUCCESS)
      return make_error("MPI_Irecv failed: {}", mpi_error_text(e));
  for (bool all = false; !all && Clock::now() < deadline;) {
    all = true;
    for (int p = 1; p < world; ++p) {
      if (!posted[p]) {
        int done = 0;
        MPI_Test(&size_req[p], &done, MPI_STATUS_IGNORE);
        if (!done) {
          all = false;
          continue;
        }
        bytes[p].resize(sizes[p]);
        for (std::size_t at = 0; at < sizes[p]; at += kChunk)
          if (int e = MPI_Irecv(bytes[p].data() + at, static_cast<int>(std::min(kChunk, sizes[p] - at)), MPI_BYTE, p,
                                kDataTag, MPI_COMM_WORLD, &data_req[p].emplace_back());
              e != MPI_SUCCESS)
            return make_error("MPI_Irecv of rank {}'s {} bytes failed: {}", p, sizes[p], mpi_error_text(e));
        posted[p] = true;
      }
      int done = 0;
      MPI_Testall(static_cast<int>(data_req[p].size()), data_req[p].data(), &done, MPI_STATUSES_IGNORE);
      all = all && done;
    }
    if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::optional<std::string>> out(static_cast<std::size_t>(world));
  out[0] = mine;
  for (int p = 1; p < world; ++p) {
    int done = 0;
    if (posted[p]) MPI_Testall(static_cast<int>(data_req[p].size()), data_req[p].data(), &done, MPI_STATUSES_IGNORE);
    if (done) out[p] = std::move(bytes[p]);
    // What never came is cancelled before its buffers go.
    cancel_pending(data_req[p]);
    if (!posted[p]) cancel_pending(std::span(&size_req[p], 1));
  }
  return out;
}

}  // namespace

Result<std::vector<std::optional<std::string>>> gather_to_root(const MpiEnvironment& env, const std::string& mine,
                                                                std::chrono::milliseconds timeout) {
  if (env.rank() == 0) return receive_all(env, mine, timeout);
  const Clock::time_point deadline = Clock::now() + timeout;
  // Not on the stack: a send rank 0 never takes may read it after we return.
  thread_local std::uint64_t size = 0;
  size = mine.size();
  std::vector<MPI_Request> r(1, MPI_REQUEST_NULL);
  int e = MPI_Isend(&size, sizeof size, MPI_BYTE, 0, kSizeTag, MPI_COMM_WORLD, r.data());
  for (std::size_t at = 0; e == MPI_SUCCESS && at < mine.size(); at += kChunk)
    e = MPI_Isend(mine.data() + at, static_cast<int>(std::min(kChunk, mine.size() - at)), MPI_BYTE, 0, kDataTag,
                  MPI_COMM_WORLD, &r.emplace_back());
  if (e != MPI_SUCCESS) return make_error("rank {}: MPI_Isend of the trace failed: {}", env.rank(), mpi_error_text(e));
  MT_ASSIGN(const bool done, wait_all(r, deadline, false));
  if (done) return std::vector<std::optional<std::string>>{};
  return make_error("rank {}: rank 0 did not take this rank's trace within {:g} s", env.rank(), seconds(timeout));
}

}  // namespace meshtrain
