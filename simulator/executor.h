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
//
// Full fidelity (replicas.cc). Ranks that issue the same ops need not submit
// them twice: replicate(source, target, map) makes `target` run every stream
// of `source` again, sharing its task arrays, with each device a task names
// (collective members, a broadcast root, send/recv peers) taken through
// `map`. Collectives meet by member set: a replica's join of the source's
// k-th collective on member set M is a join of the k-th collective on map(M)
// (sorted by GPU id), created on first use; send/recv pair the same way by
// (map(src), map(dst), k). Events get a private copy per replica. So memory
// grows with the distinct op streams, and only the execution (every rank's
// tasks and every flow) grows with the ranks.
//
// Two options keep a full-fidelity run of a thousand GPUs fast, and say what
// they change:
//  - merge_compute: back-to-back compute tasks of a stream run as one (the
//    same work; each merge moves an end by under a picosecond of rounding).
//  - isolate_exclusive: before the run, the links each member set's
//    collectives may use (the union of every algorithm the tuner can pick)
//    and each send/recv pair's route are collected; a member set whose links
//    no other set or pair uses runs its collectives analytically, which is
//    what their flows would take on links nobody else loads (e.g. a
//    tensor-parallel group alone on its node's NVSwitch ports). Collectives
//    of at most `latency_bound_bytes` are latency-bound (their flows would
//    hold a link for nanoseconds): they are always analytic and left out of
//    the footprints. Two collectives of one isolated set that overlap in time
//    are timed without sharing; RunReport::isolated_overlaps counts them.
// Idle by cause. A stream is idle from the end of one task to the start of
// the next; each such gap is charged to what the stream was waiting for:
//  - an event (wait): the stream that recorded it, split by the tasks that
//    stream ran during the wait (e.g. the data-parallel stream's
//    reduce_scatter: exposed data-parallel communication; its adamw: the
//    optimizer), the rest to the task it had last finished when it recorded;
//  - the other members of a collective it joined, or the peer of a
//    send/recv (a pipeline neighbour still computing: the bubble);
//  - at the end, the device's stream that finished last, and its last task
//    (the step's tail), or nothing on this device (other devices' work).
// Waiting is charged once, to the wait that released it; what delayed the
// releasing stream in turn is not followed.
// Per-device compute factors (set_compute_factor) model a straggler: its
// compute tasks take that many times as long. Rank threads sharing one
// machine's cores (share_host, host_sharing.h) run their compute faster
// while fewer of them compute.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "simulator/collective.h"
#include "simulator/host_sharing.h"
#include "simulator/constants.h"
#include "simulator/name_table.h"
#include "simulator/network.h"
#include "simulator/topology.h"
#include "simulator/trace.h"

namespace meshtrain::sim {

struct ExecutorOptions {
  CollectiveMode mode = CollectiveMode::kFlows;
  bool trace = false;  // collect a Chrome trace (trace())
  bool merge_compute = false;      // see "Full fidelity" above
  bool isolate_exclusive = false;  // see "Full fidelity" above
  double latency_bound_bytes = 64 * 1024;
};

// One cause of a stream's idle time (see "Idle by cause" above).
struct IdleCause {
  enum class Wait : uint8_t { kEvent, kPeers, kTransfer, kTail, kNothing };
  Wait wait = Wait::kNothing;
  std::string stream;          // kEvent, kTail: the stream it waited for; kPeers, kTransfer: its own
  std::string task;            // that stream's last finished task, or the collective or transfer joined
  bool communication = false;  // `task` is a collective or a transfer (else compute)
  Time time = 0;
};
struct StreamReport {
  int device = 0;
  std::string stream;
  Time busy = 0;  // time its tasks were running (compute and communication)
  uint64_t tasks = 0;
  Time end = 0;         // when its last task finished
  Time compute = 0;     // time its compute tasks ran (at the speed they ran)
  std::vector<IdleCause> idle;  // its idle time until the makespan, by cause
};

struct RunReport {
  Time makespan = 0;                  // when the last task finished
  std::vector<StreamReport> streams;  // by device, then stream creation order
  // Wall time of each collective (start to end) summed per kind, each
  // collective counted once; send/recv pairs count as kSendRecv.
  std::array<Time, kNumCollectiveKinds> collective_time{};
  std::array<uint64_t, kNumCollectiveKinds> collective_count{};
  std::array<double, kNumCollectiveKinds> collective_bytes{};  // nccl-tests sizes
  uint64_t events = 0;  // simulator events processed
  uint64_t tasks_run = 0;             // tasks executed, replicas' included (after merging)
  uint64_t flows = 0;                 // network flows started
  uint64_t isolated_collectives = 0;  // timed analytically by isolate_exclusive or as latency-bound
  uint64_t isolated_overlaps = 0;     // see ExecutorOptions::isolate_exclusive
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

  // `communication`: the task stands for a collective or transfer timed
  // elsewhere (analytically, its members not all simulated), so waiting for
  // it is charged as communication (IdleCause::communication); it runs as
  // compute does otherwise (it does not slow the device's compute).
  Status compute(StreamId stream, NameId name, Time duration, bool communication = false);
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

  // Compute tasks on `device` take `factor` (> 0) times as long; 1 by default.
  Status set_compute_factor(int device, double factor);
  // Every device is a rank thread of one machine sharing its cores as
  // `sharing` says; a device with compute running counts as
  // `ranks_by_device[d]` ranks (a representative stands for its replicas).
  Status share_host(const HostSharing& sharing, std::vector<double> ranks_by_device);
  // `target` (a device with no streams of its own) runs `source`'s streams
  // again with devices taken through `map` (see "Full fidelity"). Call after
  // everything is submitted on `source`, before run().
  using DeviceMap = std::function<int(int)>;
  Status replicate(int source, int target, DeviceMap map);

  Result<RunReport> run();
  const Trace& trace() const { return trace_; }

  void on_event(Simulator& sim, uint64_t tag) override;

 private:
  enum class Kind : uint8_t { kCompute, kJoin, kSend, kRecv, kRecord, kWait };
  struct Task {
    Kind kind;
    NameId name;
    int32_t a;      // compute: 1 if it stands for communication, join: collective, send/recv: p2p index, record/wait: event slot
    uint32_t b;     // wait: record count it waits for
    int64_t value;  // compute: duration (ps)
  };
  // A cause of idle time while running (IdleCause without the strings).
  struct Cause {
    IdleCause::Wait wait = IdleCause::Wait::kNothing;
    StreamId stream = 0;
    NameId task = 0;
    bool communication = false;
    bool operator==(const Cause&) const = default;
  };
  struct Stream {
    int device;
    NameId name;
    int tid;  // index on its device
    std::vector<Task> tasks;  // own tasks; a replica's stay empty
    StreamId source = 0;      // whose tasks it runs: itself, or a replica's source stream
    uint32_t replica = 0;     // 0: its own; i: replicas_[i - 1]
    size_t head = 0;
    bool running = false;  // head task started and not finished
    Time started = 0;
    Time busy = 0, compute = 0, end = 0;
    uint64_t submitted = 0;  // tasks submitted (before merging)
    // Idle by cause: since when it is idle, what it waits for now, its last
    // finished task, and the idle time charged so far.
    Time idle_since = 0;
    Cause cause;
    NameId last_task = 0;
    bool last_communication = false;
    std::vector<std::pair<Cause, Time>> idle;
    // When it reached its head task (a collective or transfer then waits for its peers).
    Time reached = 0;
    // Its latest finished tasks (start, end, name, communication), oldest first, at most kRecentTasks. A
    // collective's or transfer's start is when this stream reached it: a stream waiting on this one waited
    // for it from then, its peers' arrival included.
    struct Finished {
      Time start, end;
      NameId name;
      bool communication;
    };
    std::vector<Finished> recent;
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
    uint32_t set = 0, seq = 0;  // its member set (sets_) and its index among that set's collectives
    bool fixed_mode = false;    // the mode was given to add_collective
  };
  struct P2P {
    int src, dst;
    double bytes;
    NameId name;
    uint32_t seq = 0;  // its index among the pair's transfers
    StreamId send_stream = ~0u, recv_stream = ~0u;
    bool send_ready = false, recv_ready = false, send_submitted = false, recv_submitted = false;
    Time started = 0;
  };

  // The tasks a stream runs (its own, or its replica source's).
  const std::vector<Task>& tasks_of(const Stream& st) const { return streams_[st.source].tasks; }
  Status check_stream(StreamId s) const;
  double speed(int device) const;
  void try_start(StreamId s);
  // try_start's steps: a replica's task taken to its own collective,
  // transfer or event (false, error_ set, where it has none); stream s
  // joining collective t.a (started once every member joined); s posting
  // its side of transfer t.a (started once both sides are posted).
  bool to_replica(const Stream& st, Task& t);
  void join_collective(StreamId s, const Task& t);
  void post_transfer(StreamId s, const Task& t);
  // replicas.cc: the set id of sorted `members`; a replica's instance of a
  // template collective, p2p or event slot; merging; the isolation analysis.
  uint32_t intern_set(std::vector<int> members);
  uint32_t mapped_set(uint32_t replica, uint32_t set);
  Result<uint32_t> collective_instance(uint32_t replica, uint32_t tmpl);
  Result<uint32_t> p2p_instance(uint32_t replica, uint32_t tmpl);
  void merge_compute_tasks();
  void analyse_isolation();
  CollectiveMode mode_of(const Collective& c) const;
  void finish_head(StreamId s);
  void schedule_compute(StreamId s);
  void set_comm_active(int device, int delta);
  // Compute starts (+1) or ends (-1) on `device`: with a shared host, every
  // running compute of the machine changes speed.
  void set_compute_running(int device, int delta);
  // Banks the progress of `device`'s running compute at `old_speed` and reschedules it.
  void rebank(int device, double old_speed);
  void start_p2p(uint32_t index);
  Error deadlock_error() const;

  const Cluster& cluster_;
  const CostConstants& constants_;
  StepCosts step_costs_;  // validating a collective chooses its algorithm: route each pattern once
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
  std::vector<std::pair<Cause, Time>> event_causes_;  // by slot: its last record's releaser and time
  // Charges st's idle time from idle_since to `until` to `cause`.
  // Traced, the gaps of each device's first (default) stream become idle slices.
  void charge_idle(Stream& st, Time until, const Cause& cause);
  // st starts a collective or transfer now: its idle time so far is charged, and what it waits
  // on from here is `waiting_on` (the time before the partner arrives is idle, not busy).
  void start_waiting(Stream& st, const Cause& waiting_on);
  // Charges st's idle time until now to what stream `releaser` ran meanwhile, the rest to `rest`.
  void charge_wait(Stream& st, StreamId releaser, const Cause& rest);
  static constexpr std::size_t kRecentTasks = 256;
  std::string cause_name(const Cause& cause) const;
  // The trailing idle time of every stream, and the causes with their names.
  void charge_tails();
  std::vector<IdleCause> idle_report(const Stream& st) const;
  // Full fidelity (replicas.cc).
  struct Replica {
    int source, target;
    DeviceMap map;
    int64_t slot_offset = 0;  // its event slots: the source's + offset
    std::unordered_map<uint32_t, uint32_t> sets;  // source set -> mapped set
  };
  std::vector<Replica> replicas_;
  std::vector<std::vector<int>> sets_;  // member sets, sorted GPU ids
  std::map<std::vector<int>, uint32_t> set_ids_;
  std::vector<uint32_t> set_count_;                        // collectives created per set
  std::unordered_map<uint64_t, CollectiveId> by_set_seq_;  // (set << 32 | seq) -> collective
  std::vector<uint8_t> isolated_;                          // by set
  std::vector<uint32_t> set_running_;                      // running collectives per set
  std::vector<double> compute_factor_;                     // by device; empty: all 1
  HostSharing host_;                                       // off unless share_host()
  std::vector<double> host_ranks_;                         // by device: ranks it counts as
  std::vector<int> compute_running_;                       // by device: running compute tasks
  double host_computing_ = 0;                              // ranks computing on the machine now

  RunReport report_;
  Trace trace_;
  std::optional<Error> error_;  // first runtime error (a collective that failed to start)
  bool ran_ = false;
};

}  // namespace meshtrain::sim
