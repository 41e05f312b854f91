#include "simulator/executor.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::sim {
namespace {

constexpr uint64_t kComputeDone = 0, kCollectiveDone = 1, kP2PDone = 2;
uint64_t tag_of(uint64_t type, uint64_t id, uint64_t gen = 0) {
  return (type << 62) | ((gen & 0x3fffffffULL) << 32) | id;
}

}  // namespace

Executor::Executor(const Cluster& cluster, const CostConstants& constants, ExecutorOptions options)
    : cluster_(cluster),
      constants_(constants),
      options_(options),
      network_(std::make_unique<Network>(sim_, cluster)),
      collectives_(std::make_unique<CollectiveEngine>(sim_, *network_, constants)),
      device_streams_(cluster.num_gpus()),
      comm_active_(cluster.num_gpus(), 0) {}

Executor::~Executor() = default;

Result<StreamId> Executor::stream(int device, std::string_view name) {
  if (!cluster_.valid_gpu(device))
    return make_error("device {} is not in the cluster (0..{})", device, cluster_.num_gpus() - 1);
  const NameId n = names_.intern(name);
  for (StreamId s : device_streams_[device])
    if (streams_[s].name == n) return s;
  const StreamId id = static_cast<StreamId>(streams_.size());
  Stream st;
  st.device = device;
  st.name = n;
  st.tid = static_cast<int>(device_streams_[device].size());
  st.source = id;
  streams_.push_back(std::move(st));
  device_streams_[device].push_back(id);
  return id;
}

Status Executor::check_stream(StreamId s) const {
  if (ran_) return make_error("executor already ran; build a new one for another run");
  if (s >= streams_.size()) return make_error("stream id {} does not exist (use stream())", s);
  return ok_status();
}

Status Executor::compute(StreamId s, NameId name, Time duration, bool communication) {
  MT_TRY(check_stream(s));
  if (duration < 0)
    return make_error("compute '{}': duration must be >= 0, got {} ps", names_.name(name),
                      duration);
  streams_[s].tasks.push_back({Kind::kCompute, name, communication ? 1 : 0, 0, duration});
  ++streams_[s].submitted;
  return ok_status();
}

Result<CollectiveId> Executor::add_collective(const CollectiveRequest& request, NameId name,
                                              std::optional<CollectiveMode> mode) {
  MT_TRY(plan_collective(cluster_, constants_, request, &step_costs_).context(names_.name(name)));
  const uint32_t set = intern_set(request.members);
  const CollectiveId id = static_cast<CollectiveId>(colls_.size());
  const uint32_t seq = set_count_[set]++;
  colls_.push_back({request, name, mode.value_or(options_.mode), {}, 0, 0, set, seq, mode.has_value()});
  by_set_seq_.emplace((static_cast<uint64_t>(set) << 32) | seq, id);
  return id;
}

Status Executor::join_collective(StreamId s, CollectiveId c) {
  MT_TRY(check_stream(s));
  if (c >= colls_.size())
    return make_error("collective id {} does not exist (use add_collective())", c);
  Collective& col = colls_[c];
  const int dev = streams_[s].device;
  if (std::find(col.request.members.begin(), col.request.members.end(), dev) ==
      col.request.members.end())
    return make_error("collective '{}': device {} is not a member", names_.name(col.name), dev);
  ++col.submitted_joins;
  streams_[s].tasks.push_back({Kind::kJoin, col.name, static_cast<int32_t>(c), 0, 0});
  ++streams_[s].submitted;
  return ok_status();
}

Status Executor::send(StreamId s, int peer, double bytes, NameId name) {
  MT_TRY(check_stream(s));
  const int dev = streams_[s].device;
  if (!cluster_.valid_gpu(peer) || peer == dev)
    return make_error("send '{}' on device {}: peer {} must be another device of the cluster",
                      names_.name(name), dev, peer);
  if (!(bytes >= 0) || !std::isfinite(bytes))
    return make_error("send '{}': bytes must be finite and >= 0, got {}", names_.name(name), bytes);
  MT_TRY(cluster_.check_route(dev, peer).context(fmt::format("send '{}'", names_.name(name))));
  PairState& ps = p2p_by_pair_[{dev, peer}];
  const size_t k = ps.sends++;
  if (k == ps.entries.size()) {
    ps.entries.push_back(static_cast<uint32_t>(p2p_.size()));
    p2p_.push_back({dev, peer, 0, name, static_cast<uint32_t>(k)});
  }
  P2P& p = p2p_[ps.entries[k]];
  p.bytes = bytes;
  p.name = name;
  p.send_submitted = true;
  streams_[s].tasks.push_back({Kind::kSend, name, static_cast<int32_t>(ps.entries[k]), 0, 0});
  ++streams_[s].submitted;
  return ok_status();
}

Status Executor::recv(StreamId s, int peer, NameId name) {
  MT_TRY(check_stream(s));
  const int dev = streams_[s].device;
  if (!cluster_.valid_gpu(peer) || peer == dev)
    return make_error("recv '{}' on device {}: peer {} must be another device of the cluster",
                      names_.name(name), dev, peer);
  PairState& ps = p2p_by_pair_[{peer, dev}];
  const size_t k = ps.recvs++;
  if (k == ps.entries.size()) {
    ps.entries.push_back(static_cast<uint32_t>(p2p_.size()));
    p2p_.push_back({peer, dev, 0, name, static_cast<uint32_t>(k)});
  }
  p2p_[ps.entries[k]].recv_submitted = true;
  streams_[s].tasks.push_back({Kind::kRecv, name, static_cast<int32_t>(ps.entries[k]), 0, 0});
  ++streams_[s].submitted;
  return ok_status();
}

Status Executor::record(StreamId s, NameId event) {
  MT_TRY(check_stream(s));
  auto [it, inserted] = event_slots_.try_emplace({streams_[s].device, event},
                                                 static_cast<uint32_t>(events_submitted_.size()));
  if (inserted) {
    events_submitted_.push_back(0);
    events_recorded_.push_back(0);
  }
  const uint32_t slot = it->second;
  const uint32_t nth = ++events_submitted_[slot];
  streams_[s].tasks.push_back({Kind::kRecord, event, static_cast<int32_t>(slot), nth, 0});
  ++streams_[s].submitted;
  return ok_status();
}

Status Executor::wait(StreamId s, NameId event) {
  MT_TRY(check_stream(s));
  auto it = event_slots_.find({streams_[s].device, event});
  if (it == event_slots_.end()) return ok_status();  // nothing recorded yet: a no-op, as in CUDA
  streams_[s].tasks.push_back(
      {Kind::kWait, event, static_cast<int32_t>(it->second), events_submitted_[it->second], 0});
  ++streams_[s].submitted;
  return ok_status();
}

Status Executor::set_compute_factor(int device, double factor) {
  if (!cluster_.valid_gpu(device))
    return make_error("device {} is not in the cluster (0..{})", device, cluster_.num_gpus() - 1);
  if (!(factor > 0) || !std::isfinite(factor))
    return make_error("device {}: compute factor must be a finite number > 0, got {}", device, factor);
  if (compute_factor_.empty()) compute_factor_.assign(static_cast<size_t>(cluster_.num_gpus()), 1.0);
  compute_factor_[static_cast<size_t>(device)] = factor;
  return ok_status();
}

Status Executor::share_host(const HostSharing& sharing, std::vector<double> ranks_by_device) {
  if (ranks_by_device.size() != static_cast<size_t>(cluster_.num_gpus()))
    return make_error("share_host: {} device weights for {} devices", ranks_by_device.size(), cluster_.num_gpus());
  if (!(sharing.cores > 0 && sharing.threads_per_rank >= 1 && sharing.calibrated_share > 0 &&
        sharing.calibrated_share <= 1))
    return make_error("share_host: cores {}, threads per rank {}, calibrated share {} are not a machine", sharing.cores,
                      sharing.threads_per_rank, sharing.calibrated_share);
  host_ = sharing;
  host_ranks_ = std::move(ranks_by_device);
  compute_running_.assign(host_ranks_.size(), 0);
  return ok_status();
}

// Full-speed picoseconds of compute done per picosecond on `device` now.
double Executor::speed(int device) const {
  double v = comm_active_[device] > 0 ? 1.0 / (1.0 + constants_.comm_compute_slowdown) : 1.0;
  if (!compute_factor_.empty()) v /= compute_factor_[static_cast<size_t>(device)];
  if (host_.on()) v *= host_.speed(host_computing_);
  return v;
}

void Executor::rebank(int device, double old_speed) {
  for (StreamId s : device_streams_[device]) {
    Stream& st = streams_[s];
    if (!st.running || tasks_of(st)[st.head].kind != Kind::kCompute) continue;
    st.work_left -= static_cast<double>(sim_.now() - st.updated) * old_speed;
    if (st.work_left < 0) st.work_left = 0;
    st.updated = sim_.now();
    schedule_compute(s);
  }
}

void Executor::set_compute_running(int device, int delta) {
  if (!host_.on()) return;
  int& running = compute_running_[static_cast<size_t>(device)];
  const bool before = running > 0;
  running += delta;
  if (before == (running > 0)) return;
  // Every running compute of the machine changes speed: bank each at its old speed.
  std::vector<std::pair<int, double>> old;
  for (size_t d = 0; d < compute_running_.size(); ++d)
    if (compute_running_[d] > 0 && static_cast<int>(d) != device) old.emplace_back(static_cast<int>(d), speed(static_cast<int>(d)));
  host_computing_ += (delta > 0 ? 1.0 : -1.0) * host_ranks_[static_cast<size_t>(device)];
  if (host_computing_ < 1e-9) host_computing_ = 0;
  for (const auto& [d, v] : old) rebank(d, v);
}

void Executor::schedule_compute(StreamId s) {
  Stream& st = streams_[s];
  const double speed = this->speed(st.device);
  ++st.generation;
  const Time left = static_cast<Time>(std::ceil(st.work_left / speed - 1e-3));
  sim_.schedule(sim_.now() + std::max<Time>(left, 0), this, tag_of(kComputeDone, s, st.generation));
}

void Executor::set_comm_active(int device, int delta) {
  const bool before = comm_active_[device] > 0;
  const double old_speed = speed(device);
  comm_active_[device] += delta;
  const bool after = comm_active_[device] > 0;
  if (before == after) return;
  // The speed of running compute on this device changes: bank the progress
  // at the old speed and reschedule.
  rebank(device, old_speed);
}

bool Executor::to_replica(const Stream& st, Task& t) {
  // A replica's task names the source's collective, transfer or event:
  // take it to this replica's own (replicas.cc).
  Result<uint32_t> own = static_cast<uint32_t>(t.a);
  if (t.kind == Kind::kJoin) own = collective_instance(st.replica - 1, static_cast<uint32_t>(t.a));
  if (t.kind == Kind::kSend || t.kind == Kind::kRecv) own = p2p_instance(st.replica - 1, static_cast<uint32_t>(t.a));
  if (t.kind == Kind::kRecord || t.kind == Kind::kWait)
    own = static_cast<uint32_t>(t.a + replicas_[st.replica - 1].slot_offset);
  if (!own.ok()) {
    if (!error_) error_ = std::move(own).error();
    return false;
  }
  t.a = static_cast<int32_t>(*own);
  return true;
}

void Executor::join_collective(StreamId s, const Task& t) {
  start_waiting(streams_[s], {IdleCause::Wait::kPeers, s, t.name, true});
  Collective& c = colls_[t.a];
  c.joined.push_back(s);
  if (c.joined.size() != c.request.members.size()) return;
  // Busy time and trace slices start when the collective does, not
  // when each member arrived (waiting is idle time).
  c.started = sim_.now();
  for (StreamId m : c.joined) {
    charge_idle(streams_[m], sim_.now(), streams_[m].cause);
    streams_[m].started = sim_.now();
    set_comm_active(streams_[m].device, +1);
  }
  const CollectiveMode mode = mode_of(c);
  if (options_.isolate_exclusive) {
    if (set_running_.size() <= c.set) set_running_.resize(sets_.size(), 0);
    if (mode == CollectiveMode::kAnalytic && c.mode != CollectiveMode::kAnalytic) {
      ++report_.isolated_collectives;
      if (set_running_[c.set] > 0) ++report_.isolated_overlaps;
    }
    ++set_running_[c.set];
  }
  auto r = collectives_->start(c.request, mode, this, tag_of(kCollectiveDone, t.a));
  if (!r.ok() && !error_) error_ = r.error();
}

void Executor::post_transfer(StreamId s, const Task& t) {
  start_waiting(streams_[s], {IdleCause::Wait::kTransfer, s, t.name, true});
  P2P& p = p2p_[t.a];
  if (t.kind == Kind::kSend) {
    p.send_ready = true;
    p.send_stream = s;
  } else {
    p.recv_ready = true;
    p.recv_stream = s;
  }
  if (p.send_ready && p.recv_ready) start_p2p(static_cast<uint32_t>(t.a));
}

void Executor::try_start(StreamId s) {
  Stream& st = streams_[s];
  const std::vector<Task>& tasks = tasks_of(st);
  while (!st.running && st.head < tasks.size()) {
    Task t = tasks[st.head];
    if (st.replica != 0 && !to_replica(st, t)) return;
    switch (t.kind) {
      case Kind::kCompute:
        charge_idle(st, sim_.now(), st.cause);
        set_compute_running(st.device, +1);
        st.running = true;
        st.started = sim_.now();
        st.updated = sim_.now();
        st.work_left = static_cast<double>(t.value);
        schedule_compute(s);
        return;
      case Kind::kJoin: join_collective(s, t); return;
      case Kind::kSend:
      case Kind::kRecv: post_transfer(s, t); return;
      case Kind::kRecord: {
        events_recorded_[t.a] = std::max(events_recorded_[t.a], t.b);
        if (event_causes_.size() < events_recorded_.size()) event_causes_.resize(events_recorded_.size());
        event_causes_[t.a] = {{IdleCause::Wait::kEvent, s, st.last_task, st.last_communication}, sim_.now()};
        ++st.head;
        // A record can release waits on the other streams of this device.
        for (StreamId o : device_streams_[st.device])
          if (o != s) try_start(o);
        break;
      }
      case Kind::kWait:
        if (events_recorded_[t.a] < t.b) return;  // released by the record
        // The record that released it came after the stream went idle: it is what the stream waited for.
        if (static_cast<std::size_t>(t.a) < event_causes_.size() && event_causes_[t.a].second > st.idle_since) {
          st.cause = event_causes_[t.a].first;
          if (!st.running) charge_wait(st, st.cause.stream, st.cause);
        }
        ++st.head;
        break;
    }
  }
}

void Executor::start_p2p(uint32_t index) {
  P2P& p = p2p_[index];
  p.started = sim_.now();
  for (StreamId m : {p.send_stream, p.recv_stream}) {
    charge_idle(streams_[m], sim_.now(), streams_[m].cause);
    streams_[m].started = sim_.now();
  }
  set_comm_active(p.src, +1);
  set_comm_active(p.dst, +1);
  network_->start_flow(p.src, p.dst, p.bytes, this, tag_of(kP2PDone, index));
}

void Executor::finish_head(StreamId s) {
  Stream& st = streams_[s];
  const Task& t = tasks_of(st)[st.head];
  const Time dur = sim_.now() - st.started;
  st.busy += dur;
  st.end = sim_.now();
  if (t.kind == Kind::kCompute) st.compute += dur;
  if (options_.trace) {
    const char* cat = t.kind == Kind::kCompute ? "compute"
                      : t.kind == Kind::kJoin  ? collective_kind_name(colls_[t.a].request.kind)
                                               : (t.kind == Kind::kSend ? "send" : "recv");
    trace_.complete(st.device, st.tid, names_.name(t.name), cat, st.started, dur);
  }
  st.running = false;
  st.idle_since = sim_.now();
  st.cause = {};
  st.last_task = t.name;
  st.last_communication = t.kind != Kind::kCompute || t.a != 0;
  if (st.recent.size() >= 2 * kRecentTasks) st.recent.erase(st.recent.begin(), st.recent.end() - kRecentTasks);
  st.recent.push_back({st.last_communication ? st.reached : st.started, sim_.now(), t.name, st.last_communication});
  if (t.kind == Kind::kCompute) set_compute_running(st.device, -1);
  ++st.head;
  report_.makespan = std::max(report_.makespan, sim_.now());
  try_start(s);
}

void Executor::on_event(Simulator& sim, uint64_t tag) {
  const uint64_t type = tag >> 62;
  const uint32_t id = static_cast<uint32_t>(tag);
  if (type == kComputeDone) {
    const Stream& st = streams_[id];
    if (((tag >> 32) & 0x3fffffffULL) != (st.generation & 0x3fffffffULL)) return;  // rescheduled
    finish_head(id);
  } else if (type == kCollectiveDone) {
    Collective& c = colls_[id];
    const int k = static_cast<int>(c.request.kind);
    report_.collective_time[k] += sim.now() - c.started;
    ++report_.collective_count[k];
    report_.collective_bytes[k] += c.request.bytes;
    if (options_.isolate_exclusive) --set_running_[c.set];
    for (StreamId m : c.joined) set_comm_active(streams_[m].device, -1);
    for (StreamId m : c.joined) finish_head(m);
  } else if (type == kP2PDone) {
    P2P& p = p2p_[id];
    const int k = static_cast<int>(CollectiveKind::kSendRecv);
    report_.collective_time[k] += sim.now() - p.started;
    ++report_.collective_count[k];
    report_.collective_bytes[k] += p.bytes;
    set_comm_active(p.src, -1);
    set_comm_active(p.dst, -1);
    if (options_.trace) {
      const Stream& snd = streams_[p.send_stream];
      const Stream& rcv = streams_[p.recv_stream];
      trace_.flow_start(snd.device, snd.tid, id, p.started);
      // Inside the recv slice so viewers bind the arrow to it.
      trace_.flow_end(rcv.device, rcv.tid, id, std::max(p.started, sim.now() - 1));
    }
    finish_head(p.send_stream);
    finish_head(p.recv_stream);
  }
}

Error Executor::deadlock_error() const {
  std::string what;
  size_t stuck = 0;
  for (StreamId s = 0; s < streams_.size(); ++s) {
    const Stream& st = streams_[s];
    if (st.head >= tasks_of(st).size()) continue;
    if (++stuck > 16) continue;
    Task t = tasks_of(st)[st.head];
    std::string why;
    if (st.replica != 0) {
      // The replica's own collective, when it was created (replicas.cc).
      const Replica& r = replicas_[st.replica - 1];
      if (t.kind == Kind::kJoin)
        if (auto set = r.sets.find(colls_[t.a].set); set != r.sets.end())
          if (auto own = by_set_seq_.find((static_cast<uint64_t>(set->second) << 32) | colls_[t.a].seq);
              own != by_set_seq_.end())
            t.a = static_cast<int32_t>(own->second);
      why = fmt::format("(running device {}'s streams) ", r.source);
    }
    switch (t.kind) {
      case Kind::kJoin: {
        const Collective& c = colls_[t.a];
        std::vector<int> missing;
        for (int m : c.request.members) {
          bool in = false;
          for (StreamId j : c.joined) in = in || streams_[j].device == m;
          if (!in) missing.push_back(m);
        }
        why += fmt::format("{} waiting for devices [{}] to join",
                           collective_kind_name(c.request.kind), fmt::join(missing, ", "));
        if (c.submitted_joins < c.request.members.size())
          why += fmt::format(" ({} of {} members ever joined)", c.submitted_joins,
                             c.request.members.size());
        break;
      }
      case Kind::kSend:
      case Kind::kRecv: {
        const P2P& p = p2p_[t.a];
        const bool is_send = t.kind == Kind::kSend;
        const bool other_submitted = is_send ? p.recv_submitted : p.send_submitted;
        if (st.replica != 0) {  // the template's devices, through the replica's map
          const Replica& r = replicas_[st.replica - 1];
          why += is_send ? fmt::format("send to device {} waiting for its recv", r.map(p.dst))
                         : fmt::format("recv from device {} waiting for its send", r.map(p.src));
          break;
        }
        why += is_send ? fmt::format("send to device {} waiting for its recv", p.dst)
                       : fmt::format("recv from device {} waiting for its send", p.src);
        if (!other_submitted) why += " (never submitted)";
        break;
      }
      case Kind::kWait:
        why += "wait for an event record that cannot run";
        break;
      case Kind::kCompute:
      case Kind::kRecord:
        why += "blocked";
        break;
    }
    what += fmt::format("\n  device {} stream '{}' task {} '{}': {}", st.device,
                        names_.name(st.name), st.head, names_.name(t.name), why);
  }
  if (stuck > 16) what += fmt::format("\n  ... and {} more streams", stuck - 16);
  return make_error("deadlock: {} streams have tasks left but none can run:{}", stuck, what);
}

void Executor::start_waiting(Stream& st, const Cause& waiting_on) {
  st.running = true;
  st.started = sim_.now();
  st.reached = sim_.now();
  charge_idle(st, sim_.now(), st.cause);
  st.cause = waiting_on;
}

void Executor::charge_idle(Stream& st, Time until, const Cause& cause) {
  if (until > st.idle_since) {
    if (options_.trace && st.tid == 0) trace_.idle(st.device, 0, cause_name(cause), st.idle_since, until - st.idle_since);
    auto it = std::find_if(st.idle.begin(), st.idle.end(), [&](const auto& c) { return c.first == cause; });
    if (it != st.idle.end()) it->second += until - st.idle_since;
    else st.idle.emplace_back(cause, until - st.idle_since);
  }
  st.idle_since = std::max(st.idle_since, until);
}

void Executor::charge_wait(Stream& st, StreamId releaser, const Cause& rest) {
  const Time from = st.idle_since, to = sim_.now();
  if (to <= from) return;
  Time covered = 0;
  // Each task of the releaser that ran during the wait takes its overlap.
  for (const Stream::Finished& f : streams_[releaser].recent) {
    const Time lo = std::max(from, f.start), hi = std::min(to, f.end);
    if (hi <= lo) continue;
    Time& slot = [&]() -> Time& {
      const Cause c{IdleCause::Wait::kEvent, releaser, f.name, f.communication};
      auto it = std::find_if(st.idle.begin(), st.idle.end(), [&](const auto& x) { return x.first == c; });
      if (it != st.idle.end()) return it->second;
      st.idle.emplace_back(c, 0);
      return st.idle.back().second;
    }();
    slot += hi - lo;
    covered += hi - lo;
    if (options_.trace && st.tid == 0) trace_.idle(st.device, 0, cause_name({IdleCause::Wait::kEvent, releaser, f.name, f.communication}), lo, hi - lo);
  }
  // The rest (the releaser itself waiting) to `rest`, as one span.
  const Time left = to - from - covered;
  if (left > 0) {
    auto it = std::find_if(st.idle.begin(), st.idle.end(), [&](const auto& x) { return x.first == rest; });
    if (it != st.idle.end()) it->second += left;
    else st.idle.emplace_back(rest, left);
  }
  st.idle_since = to;
}

void Executor::charge_tails() {
  for (StreamId s = 0; s < streams_.size(); ++s) {
    Stream& st = streams_[s];
    if (st.running) continue;  // a deadlocked run reports no tails
    // The device's stream that ran longest past this one: its tail is what this one waits for.
    const Stream* last = nullptr;
    StreamId last_id = 0;
    for (StreamId o : device_streams_[st.device])
      if (o != s && streams_[o].end > st.end && (last == nullptr || streams_[o].end > last->end))
        last = &streams_[o], last_id = o;
    if (last != nullptr)
      charge_idle(st, last->end, {IdleCause::Wait::kTail, last_id, last->last_task, last->last_communication});
    charge_idle(st, report_.makespan, {});
  }
}

std::string Executor::cause_name(const Cause& c) const {
  const std::string stream = names_.name(streams_[c.stream].name), task = names_.name(c.task);
  switch (c.wait) {
    case IdleCause::Wait::kEvent:
      return fmt::format("waits for {} ({})", stream, task);
    case IdleCause::Wait::kPeers:
      return fmt::format("waits for the other members of {}", task);
    case IdleCause::Wait::kTransfer:
      return fmt::format("waits for the peer of {}", task);
    case IdleCause::Wait::kTail:
      return fmt::format("waits for {} to finish ({})", stream, task);
    case IdleCause::Wait::kNothing:
      break;
  }
  return "nothing to run on this device";
}

std::vector<IdleCause> Executor::idle_report(const Stream& st) const {
  std::vector<IdleCause> out;
  for (const auto& [cause, time] : st.idle) {
    const bool named = cause.wait != IdleCause::Wait::kNothing;
    out.push_back({cause.wait, named ? names_.name(streams_[cause.stream].name) : std::string(),
                   named ? names_.name(cause.task) : std::string(), cause.communication, time});
  }
  return out;
}

Result<RunReport> Executor::run() {
  if (ran_) return make_error("executor already ran; build a new one for another run");
  ran_ = true;
  if (options_.trace) {
    for (int d = 0; d < cluster_.num_gpus(); ++d) {
      if (device_streams_[d].empty()) continue;
      trace_.name_process(d, fmt::format("gpu {}", d));
      for (StreamId s : device_streams_[d])
        trace_.name_thread(d, streams_[s].tid, names_.name(streams_[s].name));
    }
  }
  if (options_.merge_compute) merge_compute_tasks();
  if (options_.isolate_exclusive) analyse_isolation();
  for (StreamId s = 0; s < streams_.size(); ++s) try_start(s);
  sim_.run();
  if (error_) return *error_;
  if (const auto& u = network_->unreachable()) return cluster_.check_route(u->first, u->second).error();
  for (const Stream& st : streams_)
    if (st.head < tasks_of(st).size()) return deadlock_error();
  report_.events = sim_.events_processed();
  report_.flows = network_->flows_started();
  charge_tails();
  for (const Stream& st : streams_) {
    report_.tasks_run += tasks_of(st).size();
    const uint64_t submitted = st.replica != 0 ? streams_[st.source].submitted : st.submitted;
    report_.streams.push_back(
        {st.device, names_.name(st.name), st.busy, submitted, st.end, st.compute, idle_report(st)});
  }
  std::stable_sort(
      report_.streams.begin(), report_.streams.end(),
      [](const StreamReport& a, const StreamReport& b) { return a.device < b.device; });
  return report_;
}

}  // namespace meshtrain::sim
