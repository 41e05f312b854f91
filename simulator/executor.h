// A task-graph executor: devices with named streams of tasks, run on the
// simulated cluster to completion.
//
// Model (what a CUDA program looks like to the simulator):
//  - A device is a GPU of the Cluster (device id = GPU id). Each device has
//    named streams; a stream is a FIFO queue: its head task starts when the
//    previous one has finished and the task's own condition holds.
//  - compute: runs for a given duration (from CostModel or the caller). While
//    any communication task runs on the same device, compute progresses
//    1/(1 + comm_compute_slowdown) as fast (a comm kernel takes SMs and HBM
//    bandwidth; constants.h).
//  - collective: created once with add_collective(); every member device then
//    joins it on one of its streams (join_collective). It starts when every
//    member's stream has reached its join, and all joins finish together.
//  - send / recv: the k-th send from A to B pairs with the k-th recv on B from
//    A (NCCL's per-peer ordering). The transfer starts when both are at the
//    head of their streams (rendezvous) and is one network flow.
//  - record / wait: per-device events between streams. wait(e) waits for the
//    latest record(e) submitted before it (CUDA semantics); with none, it is
//    a no-op.
// Communication runs through a Network and CollectiveEngine in the chosen
// CollectiveMode (collective.h).
//
// run() returns a RunReport, or an Error when tasks are left but nothing can
// run (deadlock), naming every stuck device, stream and task and what each
// waits for.
//
// Cost: a task is a 32-byte record; names are interned (NameTable), so
// submitting millions of tasks allocates only the task arrays. The executor
// is single-use: submit, run() once, read the report and the trace.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "simulator/collective.h"
#include "simulator/constants.h"
#include "simulator/name_table.h"
#include "simulator/network.h"
#include "simulator/topology.h"
#include "simulator/trace.h"

namespace meshtrain::sim {

struct ExecutorOptions {
  CollectiveMode mode = CollectiveMode::kFlows;
  bool trace = false;  // collect a Chrome trace (trace())
};

struct StreamReport {
  int device = 0;
  std::string stream;
  Time busy = 0;  // time its tasks were running (compute and communication)
  uint64_t tasks = 0;
};

struct RunReport {
  Time makespan = 0;                  // when the last task finished
  std::vector<StreamReport> streams;  // by device, then stream creation order
  // Wall time of each collective (start to end) summed per kind, each
  // collective counted once; send/recv pairs count as kSendRecv.
  std::array<Time, kNumCollectiveKinds> collective_time{};
  std::array<uint64_t, kNumCollectiveKinds> collective_count{};
  uint64_t events = 0;  // simulator events processed
};

using StreamId = uint32_t;
using CollectiveId = uint32_t;

class Executor : public EventHandler {
 public:
  // `cluster` and `constants` must outlive the executor.
  Executor(const Cluster& cluster, const CostConstants& constants, ExecutorOptions options = {});
  ~Executor() override;

  NameId intern(std::string_view name) { return names_.intern(name); }
  const std::string& name(NameId id) const { return names_.name(id); }

  // The stream called `name` on `device`, created on first use.
  Result<StreamId> stream(int device, std::string_view name);

  Status compute(StreamId stream, NameId name, Time duration);
  // Validates the request now; members then join on their own streams.
  // `mode` overrides ExecutorOptions::mode for this collective (e.g. analytic
  // for groups known to be uncontended, flows for the rest).
  Result<CollectiveId> add_collective(const CollectiveRequest& request, NameId name,
                                      std::optional<CollectiveMode> mode = std::nullopt);
  Status join_collective(StreamId stream, CollectiveId collective);
  Status send(StreamId stream, int peer, double bytes, NameId name);
  Status recv(StreamId stream, int peer, NameId name);
  Status record(StreamId stream, NameId event);
  Status wait(StreamId stream, NameId event);

  Result<RunReport> run();
  const Trace& trace() const { return trace_; }

  void on_event(Simulator& sim, uint64_t tag) override;

 private:
  enum class Kind : uint8_t { kCompute, kJoin, kSend, kRecv, kRecord, kWait };
  struct Task {
    Kind kind;
    NameId name;
    int32_t a;      // compute: -, join: collective, send/recv: p2p index, record/wait: event slot
    uint32_t b;     // wait: record count it waits for
    int64_t value;  // compute: duration (ps)
  };
  struct Stream {
    int device;
    NameId name;
    int tid;  // index on its device
    std::vector<Task> tasks;
    size_t head = 0;
    bool running = false;  // head task started and not finished
    Time started = 0;
    Time busy = 0;
    // Running compute: full-speed picoseconds left as of `updated`.
    double work_left = 0;
    Time updated = 0;
    uint32_t generation = 0;
  };
  struct Collective {
    CollectiveRequest request;
    NameId name;
    CollectiveMode mode;
    std::vector<StreamId> joined;
    uint32_t submitted_joins = 0;
    Time started = 0;
  };
  struct P2P {
    int src, dst;
    double bytes;
    NameId name;
    StreamId send_stream = ~0u, recv_stream = ~0u;
    bool send_ready = false, recv_ready = false, send_submitted = false, recv_submitted = false;
    Time started = 0;
  };

  Status check_stream(StreamId s) const;
  void try_start(StreamId s);
  void finish_head(StreamId s);
  void schedule_compute(StreamId s);
  void set_comm_active(int device, int delta);
  void start_p2p(uint32_t index);
  Error deadlock_error() const;

  const Cluster& cluster_;
  const CostConstants& constants_;
  ExecutorOptions options_;
  NameTable names_;
  Simulator sim_;
  std::unique_ptr<Network> network_;
  std::unique_ptr<CollectiveEngine> collectives_;
  std::vector<Stream> streams_;
  std::vector<std::vector<StreamId>> device_streams_;
  std::vector<int> comm_active_;  // running communication tasks per device
  std::vector<Collective> colls_;
  std::vector<P2P> p2p_;
  // Per (src, dst): the P2P records in order and how many sends and recvs
  // have claimed one, so the k-th send meets the k-th recv.
  struct PairState {
    std::vector<uint32_t> entries;
    size_t sends = 0, recvs = 0;
  };
  std::map<std::pair<int, int>, PairState> p2p_by_pair_;
  std::map<std::pair<int, NameId>, uint32_t> event_slots_;
  std::vector<uint32_t> events_submitted_, events_recorded_;
  RunReport report_;
  Trace trace_;
  std::optional<Error> error_;  // first runtime error (a collective that failed to start)
  bool ran_ = false;
};

}  // namespace meshtrain::sim
