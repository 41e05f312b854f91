#include "simulator/network.h"

#include <cmath>
#include <queue>

namespace meshtrain::sim {
namespace {

constexpr uint64_t kRecomputeTag = ~0ULL;

Time ceil_ps(double ps) {
  double c = std::ceil(ps - 1e-3);
  return c > 0 ? static_cast<Time>(c) : 0;
}

}  // namespace

Network::Network(Simulator& sim, const Cluster& cluster) : sim_(sim), cluster_(cluster) {
  const size_t n = cluster.links().size();
  link_flows_.resize(n);
  link_mark_.assign(n, 0);
  cap_.assign(n, 0);
  unfrozen_.assign(n, 0);
  version_.assign(n, 0);
  is_dirty_.assign(n, 0);
}

FlowId Network::start_flow(int src, int dst, double bytes, EventHandler* done, uint64_t tag) {
  ++started_;
  FlowId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<FlowId>(flows_.size());
    flows_.emplace_back();
  }
  Flow& f = flows_[id];
  f.route = cluster_.route(src, dst);
  f.remaining = bytes > 0 ? bytes : 0;
  f.rate = 0;
  f.updated = sim_.now();
  f.latency = cluster_.route_latency(f.route);
  f.done = done;
  f.tag = tag;
  ++f.generation;
  if (f.route.unreachable && !unreachable_) unreachable_ = std::make_pair(src, dst);
  if (f.route.size == 0) {
    // Nothing crosses a link: signal completion now, through the queue so
    // the caller never re-enters itself.
    sim_.schedule(sim_.now(), done, tag);
    free_.push_back(id);
    return id;
  }
  f.active = true;
  ++active_;
  for (LinkId l : f.route) link_flows_[l].push_back(id);
  mark_dirty(f.route);
  return id;
}

void Network::mark_dirty(const Route& r) {
  for (LinkId l : r)
    if (!is_dirty_[l]) {
      is_dirty_[l] = 1;
      dirty_.push_back(l);
    }
  if (!recompute_pending_) {
    recompute_pending_ = true;
    sim_.schedule(sim_.now(), this, kRecomputeTag);
  }
}

void Network::on_event(Simulator& sim, uint64_t tag) {
  if (tag == kRecomputeTag) {
    recompute_pending_ = false;
    recompute();
    return;
  }
  const FlowId id = static_cast<FlowId>(tag >> 32);
  const uint32_t gen = static_cast<uint32_t>(tag);
  if (id < flows_.size() && flows_[id].active && flows_[id].generation == gen) finish(id);
}

void Network::finish(FlowId id) {
  Flow& f = flows_[id];
  f.active = false;
  --active_;
  for (LinkId l : f.route) {
    auto& v = link_flows_[l];
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] == id) {
        v[i] = v.back();
        v.pop_back();
        break;
      }
  }
  mark_dirty(f.route);
  sim_.schedule(sim_.now() + f.latency, f.done, f.tag);
  free_.push_back(id);
}

void Network::collect_component(std::vector<LinkId>& links, std::vector<FlowId>& flows) {
  for (LinkId l : dirty_) {
    is_dirty_[l] = 0;
    if (link_mark_[l] != epoch_) {
      link_mark_[l] = epoch_;
      links.push_back(l);
    }
  }
  dirty_.clear();
  for (size_t i = 0; i < links.size(); ++i) {
    for (FlowId fid : link_flows_[links[i]]) {
      Flow& f = flows_[fid];
      if (f.mark == epoch_) continue;
      f.mark = epoch_;
      flows.push_back(fid);
      for (LinkId l : f.route)
        if (link_mark_[l] != epoch_) {
          link_mark_[l] = epoch_;
          links.push_back(l);
        }
    }
  }
}

// Every flow's remaining bytes brought up to `now` at its old rate.
void Network::advance(const std::vector<FlowId>& flows, Time now) {
  for (FlowId fid : flows) {
    Flow& f = flows_[fid];
    f.remaining -= f.rate * static_cast<double>(now - f.updated) * 1e-12;
    if (f.remaining < 0) f.remaining = 0;
    f.updated = now;
  }
}

// Progressive filling. Heap of (fair share, link), smallest first; ties by
// link id so the order is fixed. Stale entries are skipped by version. The
// component's flows come in with rate -1 (not yet frozen).
void Network::fill(const std::vector<LinkId>& links) {
  struct Entry {
    double share;
    LinkId link;
    uint32_t version;
    bool operator>(const Entry& o) const {
      return share != o.share ? share > o.share : link > o.link;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (LinkId l : links) {
    cap_[l] = cluster_.link(l).bandwidth;
    unfrozen_[l] = static_cast<uint32_t>(link_flows_[l].size());
    ++version_[l];
    if (unfrozen_[l] > 0) heap.push({cap_[l] / unfrozen_[l], l, version_[l]});
  }
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    if (e.version != version_[e.link] || unfrozen_[e.link] == 0) continue;
    const double share = e.share;
    for (FlowId fid : link_flows_[e.link]) {
      Flow& f = flows_[fid];
      if (f.rate >= 0) continue;  // already frozen
      f.rate = share;
      for (LinkId l : f.route) {
        cap_[l] -= share;
        if (cap_[l] < 0) cap_[l] = 0;
        --unfrozen_[l];
        ++version_[l];
        if (l != e.link && unfrozen_[l] > 0) heap.push({cap_[l] / unfrozen_[l], l, version_[l]});
      }
    }
  }
}

// The drain of each flow whose rate changed, rescheduled.
void Network::reschedule(const std::vector<FlowId>& flows, const std::vector<double>& old_rate, Time now) {
  for (size_t i = 0; i < flows.size(); ++i) {
    Flow& f = flows_[flows[i]];
    if (f.rate == old_rate[i]) continue;
    ++f.generation;
    const Time drain = f.rate > 0 ? ceil_ps(f.remaining * 1e12 / f.rate) : 0;
    sim_.schedule(now + drain, this, (static_cast<uint64_t>(flows[i]) << 32) | f.generation);
  }
}

void Network::recompute() {
  ++recomputations_;
  ++epoch_;
  const Time now = sim_.now();
  std::vector<LinkId> links;
  std::vector<FlowId> flows;
  collect_component(links, flows);
  flows_touched_ += flows.size();
  advance(flows, now);
  // Rate -1 marks a component flow as not yet frozen; the old rate is kept
  // so that flows whose rate did not change keep their scheduled drain.
  std::vector<double> old_rate(flows.size());
  for (size_t i = 0; i < flows.size(); ++i) {
    old_rate[i] = flows_[flows[i]].rate;
    flows_[flows[i]].rate = -1;
  }
  fill(links);
  reschedule(flows, old_rate, now);
}

}  // namespace meshtrain::sim
