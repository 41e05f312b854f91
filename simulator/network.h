// The network model: flows on routed paths sharing link bandwidth max-min
// fairly.
//
// A flow moves `bytes` from one GPU to another along Cluster::route(). While
// it has bytes left it holds a rate on every link of its route; rates are the
// max-min fair allocation (progressive filling: repeatedly find the link
// whose remaining capacity divided by its unfrozen flows is smallest, freeze
// those flows at that share, subtract it from their other links). When a flow
// starts or drains, only the connected component of links and flows that
// share a link with it (transitively) is recomputed; flows elsewhere keep
// their rates and their scheduled completions. Starts and ends at one instant
// are batched into one recomputation at that instant.
//
// Latency: a flow's bytes start competing for bandwidth at once; its
// completion is signalled when the last byte has drained plus the sum of the
// route's hop latencies (the last byte's propagation). So one flow alone takes
// latency + bytes / bottleneck bandwidth.
//
// Times are rounded up to the next whole picosecond (within 0.001 ps of a
// whole number counts as that number, so exact quotients stay exact).
//
// Cost: a recomputation touches only its component: O((F·h + L) log L) for F
// flows of h hops over L links in it. Traffic that spreads over disjoint
// links (rings, rails) stays in small components; an all-to-all through
// shared spines forms one large component, which is inherent to exact
// max-min fairness.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "simulator/event_queue.h"
#include "simulator/topology.h"

namespace meshtrain::sim {

using FlowId = uint32_t;

class Network : public EventHandler {
 public:
  // Both must outlive the Network.
  Network(Simulator& sim, const Cluster& cluster);

  // Starts a flow now. When it completes, `done->on_event(sim, tag)` is
  // scheduled. src == dst completes at once (a local copy is not network
  // traffic). GPU ids must be valid (Cluster::valid_gpu); bytes >= 0. A pair
  // with no working path (Cluster::check_route, which callers ask first)
  // completes at once too and is remembered in unreachable().
  FlowId start_flow(int src_gpu, int dst_gpu, double bytes, EventHandler* done, uint64_t tag);

  // Current rate of an active flow, bytes/s (0 before its first allocation).
  double rate(FlowId id) const { return flows_[id].rate; }
  size_t active_flows() const { return active_; }
  const Cluster& cluster() const { return cluster_; }
  uint64_t flows_started() const { return started_; }
  // Number of rate recomputations and the flows they touched: a measure of
  // the model's cost.
  uint64_t recomputations() const { return recomputations_; }
  uint64_t flows_touched() const { return flows_touched_; }
  // The first (src, dst) started without a working path, if any.
  const std::optional<std::pair<int, int>>& unreachable() const { return unreachable_; }

  void on_event(Simulator& sim, uint64_t tag) override;

 private:
  struct Flow {
    Route route;
    double remaining = 0;  // bytes not yet drained as of `updated`
    double rate = 0;       // bytes/s
    Time updated = 0;
    Time latency = 0;
    EventHandler* done = nullptr;
    uint64_t tag = 0;
    uint32_t generation = 0;  // bumped when its drain event is rescheduled
    uint32_t mark = 0;        // component-search epoch
    bool active = false;
  };
  void mark_dirty(const Route& r);
  // Max-min fair rates again for the flows that share links with the dirty
  // ones, in steps: the component (links and flows reachable from the dirty
  // links), bytes drained so far, progressive filling, drain events.
  void recompute();
  void collect_component(std::vector<LinkId>& links, std::vector<FlowId>& flows);
  void advance(const std::vector<FlowId>& flows, Time now);
  void fill(const std::vector<LinkId>& links);
  void reschedule(const std::vector<FlowId>& flows, const std::vector<double>& old_rate, Time now);
  void finish(FlowId id);

  Simulator& sim_;
  const Cluster& cluster_;
  std::vector<Flow> flows_;
  std::vector<FlowId> free_;
  std::vector<std::vector<FlowId>> link_flows_;  // active flows per link
  // Scratch per link for recompute(), valid when link_mark_ == epoch_.
  std::vector<uint32_t> link_mark_;
  std::vector<double> cap_;
  std::vector<uint32_t> unfrozen_, version_;
  std::vector<LinkId> dirty_;
  std::vector<uint8_t> is_dirty_;
  bool recompute_pending_ = false;
  uint32_t epoch_ = 0;
  size_t active_ = 0;
  uint64_t started_ = 0, recomputations_ = 0, flows_touched_ = 0;
  std::optional<std::pair<int, int>> unreachable_;
};

}  // namespace meshtrain::sim
