// NCCL communicators of one rank and the watchdog that watches them.
//
// One communicator per Group id, created on first use (every member reaches
// it at the same collective, since collectives are issued in the same order
// by all members), plus one of all ranks for point-to-point. The watchdog
// thread polls every op in flight (an event recorded after it) and every
// communicator's async error; on a failure or a timeout it hands the error
// to the sink (the backend's sticky error) and aborts every communicator so
// that no rank stays blocked inside NCCL.
//
// Topology. NCCL builds the hierarchy of a group spanning nodes itself, so
// meshtrain does not layer its own hierarchical algorithm (the cpu backend's
// MPI communicator has one) on top: at ncclCommInitRank each rank reports its
// host (a host hash) and its GPU's PCIe/NVLink/NIC position; NCCL searches
// the node's graph for rings and trees through NVLink/NVSwitch, then joins
// nodes with one ring or tree per channel, each channel on its own NIC
// (rail), so a ring crosses every node boundary once per channel and all NICs
// carry traffic at once: the per-rail inter-node ring of a hierarchical
// all-reduce. Its tree is a chain inside each node and a double binary tree
// across nodes. Its tuner (src/graph/tuning.cc) picks ring or tree (or
// NVLS/CollNet where the fabric has them) per call from latency and bus
// bandwidth tables by size and topology; the simulator's choice for NCCL
// clusters models that tuner (simulator/collective.h). NCCL orders its rings
// from the topology, not from the rank numbers, so the member order meshtrain
// passes does not matter to it. What meshtrain controls is which ranks form a
// group: the mesh (engine/plan/mesh.h) lays ranks out tensor-parallel fastest, so
// that under a by-slot placement a tensor-parallel group sits inside a node
// on NVLink and only data- and pipeline-parallel groups cross nodes.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "backends/backend.h"
#include "backends/cuda/bootstrap.h"
#include "backends/cuda/watchdog.h"

namespace meshtrain::cuda {

class NcclComms {
 public:
  using Sink = std::function<void(Error)>;
  static constexpr int kWorldGroup = -1;  // the key of the point-to-point communicator

  // `channel` may be null for a world of one (no communicator is ever made).
  NcclComms(int rank, int world, int device, std::unique_ptr<IdChannel> channel,
            std::chrono::milliseconds timeout, Sink sink);
  ~NcclComms();  // stops the watchdog, destroys the communicators
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  // Collective over all ranks.
  Status init_world();
  ncclComm_t world() const;
  // The communicator of g (size > 1), created now if this is its first use.
  Result<ncclComm_t> get(const Group& g);
  // Watches the op just issued on `stream` until it completes.
  void track(std::string op, int group, std::string peers, cudaStream_t stream);

 private:
  Result<ncclComm_t> create(const Group& g);
  void watch();
  void abort_all();

  const int rank_, world_, device_;
  std::unique_ptr<IdChannel> channel_;
  Sink sink_;
  Watchdog watchdog_;
  mutable std::mutex mu_;  // guards comms_ and aborted_ (issuing thread and watchdog)
  std::map<int, ncclComm_t> comms_;
  bool aborted_ = false;
  std::mutex stop_mu_;  // with stop_cv_: wakes the watchdog for shutdown
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace meshtrain::cuda
