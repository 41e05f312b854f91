// Host-memory communication between cpu-backend ranks.
//
// The cpu backend turns each collective op of backends/backend.h into one call
// here, on fp32 (or raw int32) host buffers. Two implementations exist: ranks
// as threads of one process (in-process) and ranks as MPI processes; the
// backend and the engine do not know which they have.
//
// Contract of every implementation:
//  * One Communicator object per rank; its methods are called by that rank's
//    single issuing thread only. Objects of different ranks are used
//    concurrently (in-process: from different threads).
//  * Every member of a group issues the same collectives on it in the same
//    order. Point-to-point messages pair by (source, destination, tag) in
//    issue order.
//  * Calls block until this rank's part is complete (the cpu backend runs
//    ops eagerly). A send returns once the data is copied out (buffered), so
//    a send never waits for the matching recv.
//  * Reductions combine contributions in ascending group order: the result is
//    bitwise identical on every member and from run to run.
//  * No call waits forever: after `timeout` it returns an Error naming the op,
//    the group (id and ranks) and the peers that had not arrived, and the
//    communicator is then poisoned (every later call fails at once) so that all
//    ranks stop. A peer that failed poisons the others too (in-process at once;
//    MPI by aborting the job).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // global rank
  virtual int world_size() const = 0;
  virtual std::string_view kind() const = 0;  // "threads" or "mpi"

  virtual Status all_reduce(std::span<float> data, const Group& g, ReduceOp op) = 0;
  // in: g.size() blocks of out.size() elements; out: this member's reduced block.
  virtual Status reduce_scatter(std::span<const float> in, std::span<float> out, const Group& g,
                                ReduceOp op) = 0;
  // out: g.size() blocks of in.size() elements, in group order.
  virtual Status all_gather(std::span<const float> in, std::span<float> out, const Group& g) = 0;
  virtual Status broadcast(std::span<float> data, const Group& g, int root_global_rank) = 0;
  virtual Status all_to_all(std::span<const float> in, std::span<const std::int64_t> send_counts,
                            std::span<float> out, std::span<const std::int64_t> recv_counts,
                            const Group& g) = 0;
  virtual Status send(std::span<const float> data, int peer_global_rank, int tag) = 0;
  virtual Status recv(std::span<float> data, int peer_global_rank, int tag) = 0;
  virtual Status barrier(const Group& g) = 0;

  // Bytes this rank has put on the wire so far, counted where it sends. Both
  // implementations move data in the same direct pattern, so they count the
  // same: all_reduce sends each of its blocks but its own to the block's
  // owner, then its reduced block to every other member (blocks as the MPI
  // communicator cuts them, n·j/G); reduce_scatter (G−1)·out; all_gather
  // (G−1)·in; broadcast (G−1)·n from the root; all_to_all every block but its
  // own; send n; barrier nothing. Tests read it to check what a plan moves
  // (gradient compression, ZeRO) instead of inferring it. Updated and read
  // by the rank's issuing thread only.
  std::int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  void count_sent(std::size_t floats) { bytes_sent_ += static_cast<std::int64_t>(floats * sizeof(float)); }

 private:
  std::int64_t bytes_sent_ = 0;
};

// Per-call wait limit; the engine passes the user's --comm-timeout here.
struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

}  // namespace meshtrain
