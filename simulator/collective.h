// Collectives as algorithms expanded into flows.
//
// A collective over n member GPUs becomes a CollectivePlan: a list of steps,
// each a pattern of point-to-point flows that all start together, repeated
// `repeats` times. A step costs α (CostConstants::collective_alpha, or
// collective_net_alpha when a flow of it leaves its node) and then lasts
// until its slowest flow has arrived; the next step starts after that
// (steps are globally synchronised: a simplification of NCCL's per-peer
// pipelining that is exact when all members see the same links).
//
// Algorithms and the steps they expand into (S = bytes as nccl-tests counts
// them, n members; per-step bytes are per flow):
//
//   all-reduce, ring:          2(n-1) steps: each member -> next, S/n
//   all-reduce, tree:          NCCL double binary tree; the buffer is halved over the two
//                              trees and cut into C chunks; 2h+C-1 pipelined steps
//                              (h = tree height), each: every tree edge up and down, S/(2C)
//   all-reduce, hierarchical:  L members per node, N nodes:
//                              intra-node ring reduce-scatter, L-1 steps of S/L;
//                              per-rail inter-node ring all-reduce, 2(N-1) steps of S/(L·N);
//                              intra-node ring all-gather, L-1 steps of S/L
//   reduce-scatter, hier.:     the first two phases, the rail rings reduce-scattering:
//                              L-1 steps of S/L, then N-1 steps of S/(L·N)
//   all-gather, hier.:         the reverse: N-1 rail steps of S/(L·N), then L-1 of S/L
//
// "Hierarchical" is NCCL's ring as it lays it out on a rail-optimized
// cluster: its channels enter and leave each node on every NIC at once (one
// ring per rail, node by node), so a member's share crosses the network once
// per node boundary on its own rail, while a flat ring over the members in
// rank order would put every node crossing of a step on one NIC. NCCL has no
// algorithm by that name; it is how its rings load the links.
//   reduce-scatter, ring:      n-1 steps of S/n
//   all-gather, ring:          n-1 steps of S/n
//   all-to-all, pairwise:      NCCL's: every peer at once (nccl-tests' busbw
//                              (n-1)/(n-L) ~ N/(N-1) NIC rates on N nodes,
//                              NVIDIA/nccl-tests#130). On one node, one member
//                              per node, members not the same number on the
//                              same local ranks of every node, or a cluster
//                              of CPU devices (MPI): 1 step, every member ->
//                              every other, S/n. Across nodes, PXN: 1 step in each
//                              node, every member -> every other, N·S/n (its
//                              own block and the N-1 it forwards to their
//                              rails), pipelined with (with_next) 1 rail
//                              step, every member -> its lane on every other
//                              node, L·S/n
//   all-to-all, deduplicated:  the token rows of a mixture-of-experts layer
//                              (CollectiveRequest::experts) as DeepEP and
//                              HybridEP move them, L members per node, N nodes,
//                              T = S / top_k the bytes of the member's tokens:
//                              1 rail step (member -> the same local GPU of
//                              every other node at once) of T · P(node), pipelined with
//                              1 step in the node (-> every other GPU of it) of
//                              N · T · P(GPU)
//                              (expert_hit_probability; see expand_deduplicated)
//   broadcast, ring:           chain from the root, C chunks: n+C-2 steps of S/C
//   send/recv, direct:         1 step: S from members[0] to members[1]
//   all-reduce, nvls:          one node on an NVLink SHARP switch: 1 step, every member ->
//                              every other, S/((n-1)·nvls_efficiency), NVLS's own α
//
// C = clamp(round(S / pipeline_chunk_bytes), 1, max_pipeline_chunks).
//
// Choice (Algorithm::kAuto): like NCCL's tuner, predict every applicable
// algorithm's time with the analytic model below and take the fastest
// (ties: the earlier in the enum). Small all-reduces at scale pick the tree
// (log n steps), large ones the ring or hierarchical, a node's large ones on
// H100/H200 NVLS. A cluster of CPU
// devices runs the cpu backend's MPI communicator instead: its all-reduce,
// reduce-scatter and all-gather expand into that communicator's direct or
// hierarchical exchange, flow for flow, chosen by its own rule
// (core/node_layout.h); collective.cc lists those expansions.
//
// Two ways to time a plan:
//  - CollectiveMode::kFlows: each step's flows go through the Network and
//    share bandwidth max-min fairly with everything else running, so
//    contention with other traffic shows. Cost: one flow per member per step.
//  - CollectiveMode::kAnalytic: no flows. Each step costs
//      α + max route latency + max over links (bytes on the link / bandwidth),
//    computed once per step pattern. This equals the flow model when nothing
//    else uses the members' links and a step's flows are equal-sized; use it
//    for collectives known not to be contended (or when a big simulation
//    must be fast), and kFlows when traffic of different groups overlaps.
//    Cost: O(flows of one step × hops) per distinct step pattern.
//
// Bandwidths are reported as nccl-tests does (doc/PERFORMANCE.md there):
// algbw = S / time; busbw = algbw · factor with factor 2(n-1)/n for
// all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, and 1
// for broadcast and send/recv.
#pragma once

#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "simulator/constants.h"
#include "simulator/network.h"

namespace meshtrain::sim {

struct Calibration;

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kSendRecv
};
inline constexpr int kNumCollectiveKinds = 6;
// kDeduplicated last: the algorithms a caller may name end at kNvls (it
// applies only to a request that states its experts). kNvls: NVLink SHARP
// (an all-reduce of one node's GPUs on an NVSwitch that reduces and
// multicasts, ClusterSpec::nvlink_sharp): every GPU's whole buffer goes up to
// the switch and the whole sum comes back, S each way per GPU, at
// CostConstants::nvls_efficiency of the NVLink's NCCL rate.
enum class Algorithm : uint8_t { kAuto, kRing, kTree, kHierarchical, kPairwise, kDirect, kNvls, kDeduplicated };
// The last algorithm a caller may name (parse_algorithm reads up to it).
inline constexpr Algorithm kLastNamedAlgorithm = Algorithm::kNvls;
enum class CollectiveMode : uint8_t { kFlows, kAnalytic };

const char* collective_kind_name(CollectiveKind kind);  // "all_reduce", ...
const char* algorithm_name(Algorithm algorithm);        // "auto", "ring", ...
Result<CollectiveKind> parse_collective_kind(std::string_view name);
Result<Algorithm> parse_algorithm(std::string_view name);

// nccl-tests bus bandwidth factor for n ranks.
double busbw_factor(CollectiveKind kind, int n);

struct CollectiveRequest {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::vector<int> members;  // GPU ids in rank order; send/recv: {src, dst}
  double bytes = 0;          // nccl-tests "size" (all-gather: the gathered output)
  Algorithm algorithm = Algorithm::kAuto;
  int root = 0;  // broadcast: index into members
  // All-to-all of a mixture-of-experts layer's token rows under a dispatcher
  // that sends each token once per destination node and GPU (DeepEP,
  // HybridEP): every row is one of a token's top_k slots, the experts split
  // evenly over the members in order; bytes = the slots' bytes. 0: a plain
  // all-to-all, each row to its member.
  int experts = 0, top_k = 0;
};

// The chance that a token's top_k distinct experts, drawn uniformly from
// `experts`, include at least one of `held` given ones:
// 1 - C(experts - held, top_k) / C(experts, top_k).
double expert_hit_probability(int experts, int top_k, int held);

struct CollectivePlan {
  Algorithm algorithm = Algorithm::kRing;
  // GPU id lists the steps refer to. A ring-form step reads its order as
  // groups of `group_size` consecutive GPUs; member i of a group sends to
  // member (i + shift) mod group_size (with `open`, the last member of each
  // group sends nothing: a chain). group_size 0: the order is (src, dst) pairs.
  std::vector<std::vector<int>> orders;
  struct Step {
    uint32_t order = 0;
    uint32_t group_size = 0;
    uint32_t shift = 1;
    bool open = false;
    double bytes = 0;  // per flow
    int repeats = 1;
    Time alpha = 0;  // > 0: the step's fixed cost in place of the collective α (NVLS's)
    // The next step's flows start with this one's, and both end with the
    // last flow of either: a pipeline of phases on different links (one α,
    // the larger; analytically the slower step, exact while the two share
    // no link). Only with repeats 1 on both.
    bool with_next = false;
  };
  std::vector<Step> steps;
};

// Calls f(src, dst) for every flow of one repetition of `step` (the order
// as CollectivePlan defines it: rings of group_size, or (src, dst) pairs).
template <class F>
void for_each_flow(const CollectivePlan& plan, const CollectivePlan::Step& step, F&& f) {
  const std::vector<int>& o = plan.orders[step.order];
  if (step.group_size == 0) {
    for (std::size_t i = 0; i + 1 < o.size(); i += 2) f(o[i], o[i + 1]);
    return;
  }
  const std::size_t gs = step.group_size;
  for (std::size_t g = 0; g + gs <= o.size(); g += gs)
    for (std::size_t i = 0; i < gs; ++i) {
      if (step.open && i == gs - 1) continue;
      f(o[g + i], o[g + (i + step.shift) % gs]);
    }
}

// The part of a step's analytic cost that does not depend on its size:
// the largest route latency of its flows, and the largest over links of
// (flows crossing the link / its bandwidth), so that the step costs
//   α + latency + bytes per flow · seconds_per_byte.
// Kept by whoever times many collectives on one unchanging cluster: a
// training step repeats the same groups at many sizes (gradient buckets,
// the loss, the norm), and routing one pattern's flows on a million-GPU
// cluster costs milliseconds. Not thread-safe: one per owner.
class StepCosts {
 public:
  struct Cost {
    Time latency = 0;
    double seconds_per_byte = 0;
    bool crosses_nodes = false;  // some flow leaves its node: the step costs the network α
  };
  Cost get(const Cluster& cluster, const CollectivePlan& plan, const CollectivePlan::Step& step);
  std::size_t patterns() const { return costs_.size(); }  // distinct patterns routed

 private:
  struct Key {
    std::vector<int> order;
    uint32_t group_size, shift;
    bool open;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  std::unordered_map<Key, Cost, KeyHash> costs_;
};

// Validates the request (members distinct and valid, the algorithm fits the
// kind and the layout) and expands it; kAuto resolves to the fastest.
// `costs` (may be null) keeps the step costs that choosing computes.
Result<CollectivePlan> plan_collective(const Cluster& cluster, const CostConstants& constants,
                                       const CollectiveRequest& request, StepCosts* costs = nullptr);
// The analytic time of a plan (see above); `costs` as for plan_collective.
Time analytic_time(const Cluster& cluster, const CostConstants& constants, const CollectivePlan& plan,
                   StepCosts* costs = nullptr);
// Every (src, dst) GPU pair a plan sends on, each once, sorted.
std::vector<std::pair<int, int>> flow_pairs(const CollectivePlan& plan);

struct CollectiveResult {
  Algorithm algorithm = Algorithm::kRing;
  Time duration = 0;
  double algbw = 0;  // bytes/s
  double busbw = 0;  // bytes/s
};
// Fills algbw/busbw from the request and a measured or simulated duration.
CollectiveResult make_collective_result(const CollectiveRequest& request, Algorithm algorithm,
                                        Time duration);

// Runs collectives in a Simulator. Plans are expanded once per start; in
// kAnalytic mode the time of an identical request (same kind, algorithm,
// members, bytes) is cached, since a training step repeats the same
// collectives many times.
class CollectiveEngine : public EventHandler {
 public:
  // All three must outlive the engine.
  CollectiveEngine(Simulator& sim, Network& network, const CostConstants& constants);

  // Starts `request` now; when it completes `done->on_event(sim, tag)` is
  // scheduled. Returns the algorithm used, or an Error for a bad request.
  Result<Algorithm> start(const CollectiveRequest& request, CollectiveMode mode, EventHandler* done,
                          uint64_t tag);
  // The analytic duration of a request (cached), without starting it.
  Result<std::pair<Algorithm, Time>> analytic(const CollectiveRequest& request);
  // With a calibration holding measured bus bandwidth for the request's kind
  // and member count, analytic mode uses time = bytes · busbw_factor / busbw
  // (measured busbw already includes per-step costs). May be null; must
  // outlive the engine.
  void set_calibration(const Calibration* calibration) { calibration_ = calibration; }

  void on_event(Simulator& sim, uint64_t tag) override;

 private:
  struct Running {
    CollectivePlan plan;
    size_t step = 0;
    int repeat = 0;
    uint32_t outstanding = 0;
    EventHandler* done = nullptr;
    uint64_t tag = 0;
  };
  void begin_step(uint32_t id);
  void launch_flows(uint32_t id);

  Simulator& sim_;
  Network& network_;
  const CostConstants& constants_;
  const Calibration* calibration_ = nullptr;
  std::vector<Running> running_;
  std::vector<uint32_t> free_;
  struct CacheEntry {
    CollectiveKind kind;
    Algorithm requested;
    double bytes;
    int root;
    std::vector<int> members;
    int experts, top_k;
    Algorithm chosen;
    Time time;
  };
  std::vector<std::vector<CacheEntry>> cache_;  // hashed buckets
  StepCosts step_costs_;
};

// One collective alone on a fresh simulator: what nccl-tests would measure.
Result<CollectiveResult> simulate_collective(const Cluster& cluster, const CostConstants& constants,
                                             const CollectiveRequest& request, CollectiveMode mode);

}  // namespace meshtrain::sim
