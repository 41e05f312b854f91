// Full fidelity (executor.h): replicas that run a source device's streams
// with their devices mapped, the member sets collectives meet by, merged
// compute runs, and the analysis that times collectives on links nobody
// else uses analytically.
#include <algorithm>
#include <set>

#include "simulator/executor.h"

namespace meshtrain::sim {

uint32_t Executor::intern_set(std::vector<int> members) {
  std::sort(members.begin(), members.end());
  auto it = set_ids_.find(members);
  if (it != set_ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(sets_.size());
  set_ids_.emplace(members, id);
  sets_.push_back(std::move(members));
  set_count_.push_back(0);
  return id;
}

uint32_t Executor::mapped_set(uint32_t replica, uint32_t set) {
  Replica& r = replicas_[replica];
  if (auto it = r.sets.find(set); it != r.sets.end()) return it->second;
  std::vector<int> members;
  members.reserve(sets_[set].size());
  for (int d : sets_[set]) members.push_back(r.map(d));
  const uint32_t id = intern_set(std::move(members));
  r.sets.emplace(set, id);
  return id;
}

Status Executor::replicate(int source, int target, DeviceMap map) {
  if (ran_) return make_error("executor already ran; build a new one for another run");
  for (int d : {source, target})
    if (!cluster_.valid_gpu(d))
      return make_error("replicate: device {} is not in the cluster (0..{})", d, cluster_.num_gpus() - 1);
  if (device_streams_[source].empty()) return make_error("replicate: device {} has no streams", source);
  if (!device_streams_[target].empty())
    return make_error("replicate: device {} already has streams; a replica starts empty", target);
  if (streams_[device_streams_[source].front()].replica != 0)
    return make_error("replicate: device {} is itself a replica; replicate its source", source);
  if (!map) return make_error("replicate: no device map");
  // Devices the map yields are checked when a collective or transfer needs
  // them (collective_instance, p2p_instance).
  Replica r{source, target, std::move(map), 0, {}};
  // A private copy of the source's event slots.
  int64_t lo = -1, hi = -1;
  for (StreamId s : device_streams_[source])
    for (const Task& t : streams_[s].tasks)
      if (t.kind == Kind::kRecord || t.kind == Kind::kWait) {
        lo = lo < 0 ? t.a : std::min<int64_t>(lo, t.a);
        hi = std::max<int64_t>(hi, t.a);
      }
  if (lo >= 0) {
    r.slot_offset = static_cast<int64_t>(events_recorded_.size()) - lo;
    events_recorded_.resize(events_recorded_.size() + static_cast<size_t>(hi - lo + 1), 0);
    events_submitted_.resize(events_recorded_.size(), 0);
  }
  replicas_.push_back(std::move(r));
  const uint32_t index = static_cast<uint32_t>(replicas_.size());
  for (StreamId s : device_streams_[source]) {
    Stream st;
    st.device = target;
    st.name = streams_[s].name;
    st.tid = streams_[s].tid;
    st.source = s;
    st.replica = index;
    device_streams_[target].push_back(static_cast<StreamId>(streams_.size()));
    streams_.push_back(std::move(st));
  }
  return ok_status();
}

Result<uint32_t> Executor::collective_instance(uint32_t replica, uint32_t tmpl) {
  const uint32_t set = mapped_set(replica, colls_[tmpl].set);
  const uint64_t key = (static_cast<uint64_t>(set) << 32) | colls_[tmpl].seq;
  if (auto it = by_set_seq_.find(key); it != by_set_seq_.end()) return it->second;
  const Collective& t = colls_[tmpl];
  Collective c;
  c.request = t.request;
  c.request.members = sets_[set];
  const Replica& r = replicas_[replica];
  const int root = r.map(t.request.members[static_cast<size_t>(t.request.root)]);
  auto at = std::find(c.request.members.begin(), c.request.members.end(), root);
  c.request.root = static_cast<int>(at - c.request.members.begin());
  c.name = t.name;
  c.mode = t.mode;
  c.fixed_mode = t.fixed_mode;
  c.set = set;
  c.seq = t.seq;
  c.submitted_joins = static_cast<uint32_t>(c.request.members.size());
  // Validates the mapped members (valid, distinct GPUs) and, with failed
  // links, that every pair of the plan has a working path.
  MT_TRY(plan_collective(cluster_, constants_, c.request, &step_costs_)
             .context(fmt::format("{} of replica device {} (of device {})", names_.name(c.name),
                                  r.target, r.source)));
  const CollectiveId id = static_cast<CollectiveId>(colls_.size());
  colls_.push_back(std::move(c));
  by_set_seq_.emplace(key, id);
  return id;
}

Result<uint32_t> Executor::p2p_instance(uint32_t replica, uint32_t tmpl) {
  const P2P t = p2p_[tmpl];
  const Replica& r = replicas_[replica];
  const int src = r.map(t.src), dst = r.map(t.dst);
  if (!cluster_.valid_gpu(src) || !cluster_.valid_gpu(dst) || src == dst)
    return make_error("'{}' of replica device {}: the map gives devices {} -> {}", names_.name(t.name),
                      r.target, src, dst);
  PairState& ps = p2p_by_pair_[{src, dst}];
  constexpr uint32_t kNone = ~0u;
  if (ps.entries.size() <= t.seq) ps.entries.resize(t.seq + 1, kNone);
  if (ps.entries[t.seq] != kNone) return ps.entries[t.seq];
  MT_TRY(cluster_.check_route(src, dst).context(names_.name(t.name)));
  P2P p{src, dst, t.bytes, t.name, t.seq};
  p.send_submitted = p.recv_submitted = true;
  ps.entries[t.seq] = static_cast<uint32_t>(p2p_.size());
  p2p_.push_back(p);
  return ps.entries[t.seq];
}

void Executor::merge_compute_tasks() {
  for (Stream& st : streams_) {
    if (st.replica != 0) continue;
    std::vector<Task> merged;
    merged.reserve(st.tasks.size());
    for (const Task& t : st.tasks) {
      // Only alike tasks merge: one that stands for communication keeps its mark.
      if (t.kind == Kind::kCompute && !merged.empty() && merged.back().kind == Kind::kCompute &&
          merged.back().a == t.a)
        merged.back().value += t.value;
      else
        merged.push_back(t);
    }
    st.tasks = std::move(merged);
  }
}

CollectiveMode Executor::mode_of(const Collective& c) const {
  if (!options_.isolate_exclusive || c.fixed_mode) return c.mode;
  if (c.request.bytes <= options_.latency_bound_bytes) return CollectiveMode::kAnalytic;
  return c.set < isolated_.size() && isolated_[c.set] ? CollectiveMode::kAnalytic : c.mode;
}

void Executor::analyse_isolation() {
  // 1. The kinds of non-latency-bound collectives on every member set: the
  // templates', and through each replica's map the sets its replica joins.
  std::vector<uint32_t> kinds(sets_.size(), 0);
  for (const Collective& c : colls_)
    if (c.request.bytes > options_.latency_bound_bytes && !c.fixed_mode)
      kinds[c.set] |= 1u << static_cast<int>(c.request.kind);
  std::set<std::pair<int, int>> pairs;
  for (const P2P& p : p2p_) pairs.emplace(p.src, p.dst);
  // Per source device: the template sets its streams join and the pairs it sends on.
  std::map<int, std::pair<std::set<uint32_t>, std::set<std::pair<int, int>>>> used;
  for (const Replica& r : replicas_) {
    if (used.count(r.source)) continue;
    auto& [sets, sends] = used[r.source];
    for (StreamId s : device_streams_[r.source])
      for (const Task& t : streams_[s].tasks) {
        if (t.kind == Kind::kJoin) sets.insert(colls_[static_cast<size_t>(t.a)].set);
        if (t.kind == Kind::kSend) {
          const P2P& p = p2p_[static_cast<size_t>(t.a)];
          sends.emplace(p.src, p.dst);
        }
      }
  }
  for (uint32_t i = 0; i < replicas_.size(); ++i) {
    const auto& [sets, sends] = used[replicas_[i].source];
    for (uint32_t set : sets) {
      const uint32_t m = mapped_set(i, set);
      if (kinds.size() < sets_.size()) kinds.resize(sets_.size(), 0);
      kinds[m] |= kinds[set];
    }
    for (const auto& [src, dst] : sends) pairs.emplace(replicas_[i].map(src), replicas_[i].map(dst));
  }
  kinds.resize(sets_.size(), 0);
  // 2. Footprints: every link any algorithm the tuner may pick for those
  // kinds would use, and every pair's route.
  std::vector<std::vector<LinkId>> footprint(sets_.size());
  for (uint32_t set = 0; set < sets_.size(); ++set) {
    if (kinds[set] == 0 || sets_[set].size() < 2) continue;
    std::vector<LinkId>& links = footprint[set];
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      if (!(kinds[set] & (1u << k))) continue;
      for (int a = static_cast<int>(Algorithm::kRing); a <= static_cast<int>(kLastNamedAlgorithm); ++a) {
        CollectiveRequest req{static_cast<CollectiveKind>(k), sets_[set], 1 << 20, static_cast<Algorithm>(a), 0};
        auto plan = plan_collective(cluster_, constants_, req);
        if (!plan.ok()) continue;  // the algorithm does not apply
        for (const auto& [src, dst] : flow_pairs(*plan))
          for (LinkId l : cluster_.route(src, dst)) links.push_back(l);
      }
    }
    std::sort(links.begin(), links.end());
    links.erase(std::unique(links.begin(), links.end()), links.end());
  }
  // 3. Users per link: member sets and pairs that may put traffic on it.
  std::vector<uint32_t> users(cluster_.links().size(), 0);
  for (const auto& links : footprint)
    for (LinkId l : links) ++users[l];
  for (const auto& [src, dst] : pairs) {
    Route r = cluster_.route(src, dst);
    std::sort(r.links.begin(), r.links.begin() + r.size);
    const LinkId* end = std::unique(r.links.begin(), r.links.begin() + r.size);
    for (const LinkId* l = r.links.data(); l != end; ++l) ++users[*l];
  }
  isolated_.assign(sets_.size(), 0);
  for (uint32_t set = 0; set < sets_.size(); ++set)
    isolated_[set] = !footprint[set].empty() &&
                     std::all_of(footprint[set].begin(), footprint[set].end(),
                                 [&](LinkId l) { return users[l] == 1; });
  set_running_.assign(sets_.size(), 0);
}

}  // namespace meshtrain::sim
