#include "simulator/collective.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <limits>

#include "core/node_layout.h"
#include "simulator/calibration.h"

namespace meshtrain::sim {
namespace {

// NCCL's binary tree (src/graph/trees.cc, ncclGetBtree): rank r's parent is
// found from its lowest set bit; rank 0 is the root with one child.
int btree_parent(int n, int r) {
  if (r == 0) return -1;
  int bit = 1;
  while (!(bit & r)) bit <<= 1;
  int up = (r ^ bit) | (bit << 1);
  if (up >= n) up = r ^ bit;
  return up;
}

// The second tree (ncclGetDtree): mirrored for even n, shifted by one for odd
// n, so that each rank is interior in at most one of the two trees.
int dtree_parent(int n, int r) {
  if (n % 2 == 1) {
    const int p = btree_parent(n, (r - 1 + n) % n);
    return p < 0 ? -1 : (p + 1) % n;
  }
  const int p = btree_parent(n, n - 1 - r);
  return p < 0 ? -1 : n - 1 - p;
}

int tree_height(int n, int (*parent)(int, int)) {
  int h = 0;
  for (int r = 0; r < n; ++r) {
    int d = 0;
    for (int x = r; parent(n, x) >= 0; x = parent(n, x)) ++d;
    h = std::max(h, d);
  }
  return h;
}

int pipeline_chunks(const CostConstants& c, double bytes) {
  const double chunks = std::round(bytes / c.pipeline_chunk_bytes);
  return static_cast<int>(std::clamp(chunks, 1.0, static_cast<double>(c.max_pipeline_chunks)));
}

// A step's fixed cost: its own (NVLS) or the collective α of where its flows go.
Time step_alpha(const CostConstants& c, const CollectivePlan::Step& step, bool crosses_nodes) {
  if (step.alpha > 0) return step.alpha;
  return crosses_nodes ? c.collective_net_alpha : c.collective_alpha;
}

bool fits(CollectiveKind kind, Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return true;
    case Algorithm::kRing:
      return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter ||
             kind == CollectiveKind::kAllGather || kind == CollectiveKind::kBroadcast;
    case Algorithm::kTree:
    case Algorithm::kNvls:
      return kind == CollectiveKind::kAllReduce;
    case Algorithm::kHierarchical:
    case Algorithm::kDirect:  // send/recv; host all-reduce, reduce-scatter, all-gather
      return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter ||
             kind == CollectiveKind::kAllGather || (a == Algorithm::kDirect && kind == CollectiveKind::kSendRecv);
    case Algorithm::kPairwise:
    case Algorithm::kDeduplicated:
      return kind == CollectiveKind::kAllToAll;
  }
  return false;
}

// (src, dst) pairs, the order of a step that sends at once from every
// member of each group to every other member of it.
std::vector<int> pairs_within(const std::vector<std::vector<int>>& groups) {
  std::vector<int> pairs;
  for (const auto& g : groups)
    for (int src : g)
      for (int dst : g)
        if (src != dst) pairs.insert(pairs.end(), {src, dst});
  return pairs;
}

// Members grouped by node, each group sorted by GPU id; Error unless every
// node holds the same number of members on the same local ranks (so the
// inter-node rings run rail by rail).
Result<std::vector<std::vector<int>>> per_node_groups(const Cluster& cluster,
                                                      const std::vector<int>& members) {
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int>> groups;
  for (int g : sorted) {
    if (groups.empty() || cluster.node_of(groups.back().front()) != cluster.node_of(g))
      groups.emplace_back();
    groups.back().push_back(g);
  }
  if (groups.size() < 2)
    return make_error("hierarchical all-reduce needs members on at least 2 nodes, got 1");
  for (const auto& grp : groups) {
    if (grp.size() != groups[0].size())
      return make_error(
          "hierarchical all-reduce needs the same number of members on every node; "
          "node {} has {}, node {} has {}",
          cluster.node_of(groups[0][0]), groups[0].size(), cluster.node_of(grp[0]), grp.size());
    for (size_t i = 0; i < grp.size(); ++i)
      if (cluster.local_rank(grp[i]) != cluster.local_rank(groups[0][i]))
        return make_error(
            "hierarchical all-reduce needs the same local GPUs on every node "
            "(rail-aligned); node {} differs from node {}",
            cluster.node_of(grp[0]), cluster.node_of(groups[0][0]));
  }
  return groups;
}

// Whose collectives a cluster runs, which decides how its collectives'
// algorithms are chosen (choose_plan):
//  * GPU clusters run NCCL. NCCL's tuner picks ring or tree (or NVLS/CollNet)
//    per call from its latency and bandwidth model by size and topology; we
//    predict each algorithm's time and take the fastest, as it does. Our
//    "hierarchical" all-reduce stands for NCCL's ring with a channel per rail,
//    which crosses each node boundary on every NIC at once: NCCL has no
//    separate hierarchical algorithm (backends/cuda/nccl_comm.h).
//  * A cluster of CPU devices (the device's name says "cpu", as calibration
//    reads it: local-cpu) runs the cpu backend, whose MPI communicator
//    (backends/cpu/comm/mpi_communicator.h) reduces, scatters and gathers by
//    the flat direct exchange or hierarchically, by the rule of
//    core/node_layout.h. We expand its algorithms flow for flow (expand_host)
//    and choose by the same rule, so that we time what runs.
bool runs_host_collectives(const Cluster& cluster) {
  std::string device = cluster.spec().device.name;
  std::transform(device.begin(), device.end(), device.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return device.find("cpu") != std::string::npos;
}

// The node of each member, in request (group) order.
std::vector<int> member_nodes(const Cluster& cluster, const std::vector<int>& members) {
  std::vector<int> nodes;
  for (int g : members) nodes.push_back(cluster.node_of(g));
  return nodes;
}

// The host communicator's algorithms (backends/cpu/comm/mpi_communicator.h),
// flow for flow. Members in group order, N nodes of L; S as nccl-tests counts it.
//   direct (flat):               one step of every member -> every other, S/n
//                                (all-reduce: two, reduce-scatter then all-gather)
//   hierarchical all-reduce:     lanes to their owners inside the node (S/L per
//                                pair); the chain node 0 -> 1 -> ... -> N-1 per
//                                lane in C pipelined chunks of S/(L·C), N+C-2
//                                steps; the last node -> the member of the same
//                                lane on every other node, S/L; the lanes'
//                                all-gather inside the node, S/L
//   hierarchical reduce-scatter: the same up to the chain, then the last node
//                                sends each block (S/n) to its owner
//   hierarchical all-gather:     across nodes by local index, S/n; inside the
//                                node, the N blocks of each (S/L)
Result<CollectivePlan> expand_host(const Cluster& cluster, const CostConstants& c,
                                   const CollectiveRequest& req, Algorithm a) {
  using Step = CollectivePlan::Step;
  const int n = static_cast<int>(req.members.size());
  const double S = req.bytes;
  CollectivePlan p;
  p.algorithm = a;
  auto add_pairs = [&](std::vector<int> pairs, double bytes, int repeats) {
    if (pairs.empty()) return;
    p.orders.push_back(std::move(pairs));
    p.steps.push_back(Step{static_cast<uint32_t>(p.orders.size() - 1), 0, 0, false, bytes, repeats});
  };
  // Every member to every other member of the same block of `size` members
  // (stride 1), or of the same local index across blocks (the rails).
  auto all_pairs = [&](int size, bool rails, int L) {
    std::vector<int> pairs;
    for (int x = 0; x < n; ++x)
      for (int y = 0; y < n; ++y) {
        const bool together = rails ? x % L == y % L : x / size == y / size;
        if (x != y && together) pairs.insert(pairs.end(), {req.members[x], req.members[y]});
      }
    return pairs;
  };
  if (a == Algorithm::kDirect) {
    // Every member sends block j to member j (reduce-scatter; all-reduce's
    // first phase) or its own block to everyone (all-gather; the second phase).
    const int phases = req.kind == CollectiveKind::kAllReduce ? 2 : 1;
    add_pairs(all_pairs(n, false, 1), S / n, phases);
    return p;
  }
  const auto blocks = node_blocks(member_nodes(cluster, req.members));
  if (!blocks || blocks->nodes < 2 || blocks->per_node < 2)
    return make_error(
        "hierarchical {} on host ranks needs members on at least 2 nodes, the same number (>= 2) on "
        "each, each node's members contiguous in group order",
        collective_kind_name(req.kind));
  const int N = blocks->nodes, L = blocks->per_node;
  auto member = [&](int node, int lane) { return req.members[static_cast<std::size_t>(node * L + lane)]; };
  if (req.kind == CollectiveKind::kAllGather) {
    add_pairs(all_pairs(n, true, L), S / n, 1);  // across nodes, by local index
    add_pairs(all_pairs(L, false, L), S / L, 1);  // inside the node: N blocks each
    return p;
  }
  // All-reduce and reduce-scatter: a lane (S/L) to its owner inside the node,
  // the chain across nodes in C pipelined chunks (hop h carries chunk t - h at
  // step t), then the last node hands the results back.
  add_pairs(all_pairs(L, false, L), S / L, 1);
  const int C = pipeline_chunks(c, S / L);
  for (int t = 0; t < N + C - 2;) {
    const int lo = std::max(0, t - C + 1), hi = std::min(N - 2, t);
    int same = 1;  // steps with the same active hops share one order
    while (t + same < N + C - 2 && std::max(0, t + same - C + 1) == lo && std::min(N - 2, t + same) == hi) ++same;
    std::vector<int> pairs;
    for (int lane = 0; lane < L; ++lane)
      for (int h = lo; h <= hi; ++h) pairs.insert(pairs.end(), {member(h, lane), member(h + 1, lane)});
    add_pairs(std::move(pairs), S / L / C, same);
    t += same;
  }
  std::vector<int> back;
  for (int lane = 0; lane < L; ++lane)
    for (int node = 0; node < N - 1; ++node) back.insert(back.end(), {member(N - 1, lane), member(node, lane)});
  if (req.kind == CollectiveKind::kAllReduce) {
    add_pairs(std::move(back), S / L, 1);
    add_pairs(all_pairs(L, false, L), S / L, 1);  // all-gather of the lanes
  } else {
    add_pairs(std::move(back), S / n, 1);  // one block to its owner
  }
  return p;
}

// The members of each local index across per-node groups (the rails).
std::vector<std::vector<int>> lanes_of(const std::vector<std::vector<int>>& groups) {
  std::vector<std::vector<int>> lanes(groups[0].size());
  for (const auto& g : groups)
    for (std::size_t j = 0; j < g.size(); ++j) lanes[j].push_back(g[j]);
  return lanes;
}

// NCCL's all-to-all: one group of sends and receives to every peer at once,
// so a member's blocks leave through all its links together (nccl-tests'
// busbw reaches N/(N-1) NIC rates on N nodes, NVIDIA/nccl-tests#130). Across
// rail-optimised nodes NCCL moves them with PXN (NCCL >= 2.12, on by
// default): a block for GPU j of another node first crosses NVLink to the
// sender node's GPU on j's rail, which sends the L blocks its node holds for
// j over that rail in one transfer. So: inside each node, every member to
// every other its own block and the N-1 it forwards (N·S/n); then along each
// rail, every member to every other node's (L·S/n). Each NIC carries
// (N-1)·L·S/n, what crosses nodes, and no traffic changes rail on the
// spines. NCCL's proxy pipelines the two phases (a chunk goes out on the
// rail as soon as it has crossed NVLink), so they start together and the
// slower, the NIC's, sets the time (Step::with_next). Members on one node,
// one per node, or not the same number on the same local ranks of every
// node, send directly: one step of S/n to every peer; so does the cpu
// backend's MPI all-to-all (runs_host_collectives), which posts every send
// and receive at once.
Result<CollectivePlan> expand_all_to_all(const Cluster& cluster, const CollectiveRequest& req) {
  const int n = static_cast<int>(req.members.size());
  const double S = req.bytes;
  using Step = CollectivePlan::Step;
  CollectivePlan p;
  p.algorithm = Algorithm::kPairwise;
  auto direct = [&] {
    p.orders.push_back(pairs_within({req.members}));
    p.steps.push_back(Step{0, 0, 0, false, S / n, 1});
    return std::move(p);
  };
  if (runs_host_collectives(cluster)) return direct();
  auto groups = per_node_groups(cluster, req.members);
  if (!groups.ok() || (*groups)[0].size() == 1) return direct();
  const int N = static_cast<int>(groups->size()), L = static_cast<int>((*groups)[0].size());
  p.orders = {pairs_within(*groups), pairs_within(lanes_of(*groups))};
  p.steps.push_back(Step{0, 0, 0, false, N * S / n, 1});
  p.steps.back().with_next = true;
  p.steps.push_back(Step{1, 0, 0, false, L * S / n, 1});
  return p;
}

// The token rows of a mixture-of-experts layer as DeepEP's internode
// dispatch and HybridEP move them (csrc/kernels/internode.cu there: a token
// goes once to each destination node, to the GPU of its own local rank
// there, with a bit per GPU of that node that hosts one of its experts; that
// GPU forwards it over NVLink to those GPUs, once each, and they copy it into
// their experts' rows). Under uniform routing a member's T token bytes reach
// each other node with P(node) = expert_hit_probability(E, K, experts of the
// node) and each GPU with P(GPU) (its E/n experts); a GPU forwards to each
// other GPU of its node what its own and one member of every other node sent
// it for that GPU. The combine is the reverse and costs the same. Each
// phase sends to all its peers at once, and the kernels pipeline the two
// (a token is forwarded as it arrives), so they start together
// (Step::with_next).
Result<CollectivePlan> expand_deduplicated(const Cluster& cluster, const CollectiveRequest& req) {
  const int n = static_cast<int>(req.members.size());
  if (req.experts <= 0 || req.top_k <= 0 || req.top_k > req.experts || req.experts % n != 0)
    return make_error("deduplicated all_to_all: needs experts ({}) split evenly over the {} members and 0 < top_k "
                      "({}) <= experts",
                      req.experts, n, req.top_k);
  std::vector<std::vector<int>> groups;
  std::vector<int> nodes = req.members;
  std::sort(nodes.begin(), nodes.end());
  if (cluster.node_of(nodes.front()) == cluster.node_of(nodes.back())) {
    groups.push_back(std::move(nodes));
  } else {
    MT_ASSIGN(groups, per_node_groups(cluster, req.members));
  }
  const int N = static_cast<int>(groups.size()), L = static_cast<int>(groups[0].size());
  const int per_gpu = req.experts / n;
  const double tokens = req.bytes / req.top_k;
  CollectivePlan p;
  p.algorithm = Algorithm::kDeduplicated;
  p.orders = {pairs_within(lanes_of(groups)), pairs_within(groups)};
  using Step = CollectivePlan::Step;
  const double to_node = tokens * expert_hit_probability(req.experts, req.top_k, per_gpu * L);
  if (N > 1) {
    p.steps.push_back(Step{0, 0, 0, false, to_node, 1});
    p.steps.back().with_next = L > 1;
  }
  const double to_gpu = N * tokens * expert_hit_probability(req.experts, req.top_k, per_gpu);
  if (L > 1) p.steps.push_back(Step{1, 0, 0, false, to_gpu, 1});
  return p;
}

// NVLink SHARP all-reduce (Algorithm::kNvls): one pass through the node's
// switch, S out of and S into every GPU, drawn as flows of S/(n-1) to every
// other member at the switch's share of the link, with NCCL's NVLS latency.
Result<CollectivePlan> expand_nvls(const Cluster& cluster, const CostConstants& c, const CollectiveRequest& req) {
  if (!cluster.spec().nvlink_sharp)
    return make_error("all_reduce 'nvls' needs an NVSwitch with NVLink SHARP; cluster '{}' has none",
                      cluster.spec().name);
  const auto nodes = member_nodes(cluster, req.members);
  if (std::any_of(nodes.begin(), nodes.end(), [&](int node) { return node != nodes[0]; }))
    return make_error("all_reduce 'nvls' runs inside one node; the members span several");
  CollectivePlan p;
  p.algorithm = Algorithm::kNvls;
  const int n = static_cast<int>(req.members.size());
  p.orders.push_back(pairs_within({req.members}));
  CollectivePlan::Step step{0, 0, 0, false, req.bytes / (n - 1) / c.nvls_efficiency, 1};
  step.alpha = c.nvls_alpha;
  p.steps.push_back(step);
  return p;
}

Result<CollectivePlan> expand(const Cluster& cluster, const CostConstants& c,
                              const CollectiveRequest& req, Algorithm a) {
  const bool host_algorithm = a == Algorithm::kHierarchical ? runs_host_collectives(cluster)
                                                            : a == Algorithm::kDirect && req.kind != CollectiveKind::kSendRecv;
  if (host_algorithm) {
    if (!runs_host_collectives(cluster))
      return make_error("{} '{}' is the host communicator's algorithm; cluster '{}' runs NCCL's (ring, tree, "
                        "hierarchical, nvls)",
                        collective_kind_name(req.kind), algorithm_name(a), cluster.spec().name);
    if (req.members.size() < 2 || req.bytes <= 0) return CollectivePlan{a, {}, {}};
    return expand_host(cluster, c, req, a);
  }
  const int n = static_cast<int>(req.members.size());
  const double S = req.bytes;
  CollectivePlan p;
  p.algorithm = a;
  if (n < 2 || S <= 0) return p;  // nothing moves
  using Step = CollectivePlan::Step;
  const uint32_t un = static_cast<uint32_t>(n);
  switch (a) {
    case Algorithm::kRing:
      if (req.kind == CollectiveKind::kBroadcast) {
        std::vector<int> chain(req.members.begin() + req.root, req.members.end());
        chain.insert(chain.end(), req.members.begin(), req.members.begin() + req.root);
        p.orders.push_back(std::move(chain));
        const int C = pipeline_chunks(c, S);
        p.steps.push_back(Step{0, un, 1, true, S / C, n + C - 2});
      } else {
        p.orders.push_back(req.members);
        const int reps = req.kind == CollectiveKind::kAllReduce ? 2 * (n - 1) : n - 1;
        p.steps.push_back(Step{0, un, 1, false, S / n, reps});
      }
      return p;
    case Algorithm::kTree: {
      std::vector<int> pairs;
      pairs.reserve(8 * static_cast<size_t>(n));
      for (auto parent : {btree_parent, dtree_parent})
        for (int r = 0; r < n; ++r) {
          const int up = parent(n, r);
          if (up < 0) continue;
          pairs.insert(pairs.end(),
                       {req.members[r], req.members[up], req.members[up], req.members[r]});
        }
      p.orders.push_back(std::move(pairs));
      const int C = pipeline_chunks(c, S / 2);
      const int h = std::max(tree_height(n, btree_parent), tree_height(n, dtree_parent));
      p.steps.push_back(Step{0, 0, 0, false, S / (2.0 * C), 2 * h + C - 1});
      return p;
    }
    case Algorithm::kHierarchical: {
      MT_ASSIGN(auto groups, per_node_groups(cluster, req.members));
      const int N = static_cast<int>(groups.size());
      const int L = static_cast<int>(groups[0].size());
      std::vector<int> intra, rails;
      for (const auto& g : groups) intra.insert(intra.end(), g.begin(), g.end());
      for (int j = 0; j < L; ++j)
        for (const auto& g : groups) rails.push_back(g[j]);
      p.orders.push_back(std::move(intra));
      p.orders.push_back(std::move(rails));
      const auto uL = static_cast<uint32_t>(L), uN = static_cast<uint32_t>(N);
      const Step in_node{0, uL, 1, false, S / L, L - 1}, across{1, uN, 1, false, S / L / N, N - 1};
      // Reduce-scatter: the node's sum first, so that only each member's
      // 1/L crosses the network; all-gather the reverse; all-reduce both
      // (its rail rings all-reduce: 2(N-1) steps).
      if (L > 1 && req.kind != CollectiveKind::kAllGather) p.steps.push_back(in_node);
      p.steps.push_back(across);
      if (req.kind == CollectiveKind::kAllReduce) p.steps.back().repeats = 2 * (N - 1);
      if (L > 1 && req.kind != CollectiveKind::kReduceScatter) p.steps.push_back(in_node);
      return p;
    }
    case Algorithm::kPairwise:
      return expand_all_to_all(cluster, req);
    case Algorithm::kDirect:
      p.orders.push_back({req.members[0], req.members[1]});
      p.steps.push_back(Step{0, 0, 0, false, S, 1});
      return p;
    case Algorithm::kNvls:
      return expand_nvls(cluster, c, req);
    case Algorithm::kDeduplicated:
      return expand_deduplicated(cluster, req);
    case Algorithm::kAuto:
      break;
  }
  return make_error("internal: unexpanded algorithm");
}

Result<CollectivePlan> choose_plan(const Cluster& cluster, const CostConstants& c,
                                   const CollectiveRequest& req, StepCosts* costs);

}  // namespace

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kSendRecv:
      return "send_recv";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kPairwise:
      return "pairwise";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kNvls:
      return "nvls";
    case Algorithm::kDeduplicated:
      return "deduplicated";
  }
  return "?";
}

Result<CollectiveKind> parse_collective_kind(std::string_view name) {
  for (int k = 0; k < kNumCollectiveKinds; ++k)
    if (name == collective_kind_name(static_cast<CollectiveKind>(k)))
      return static_cast<CollectiveKind>(k);
  return make_error(
      "unknown collective kind '{}'; known: all_reduce, reduce_scatter, all_gather, "
      "all_to_all, broadcast, send_recv",
      name);
}

Result<Algorithm> parse_algorithm(std::string_view name) {
  for (int a = 0; a <= static_cast<int>(kLastNamedAlgorithm); ++a)
    if (name == algorithm_name(static_cast<Algorithm>(a))) return static_cast<Algorithm>(a);
  return make_error(
      "unknown collective algorithm '{}'; known: auto, ring, tree, hierarchical, "
      "pairwise, direct, nvls",
      name);
}

double busbw_factor(CollectiveKind kind, int n) {
  if (n < 1) return 0;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return static_cast<double>(n - 1) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kSendRecv:
      return 1.0;
  }
  return 0;
}

double expert_hit_probability(int experts, int top_k, int held) {
  // C(E - h, K) / C(E, K) = Π_{i<K} (E - h - i) / (E - i): the chance all K miss.
  double miss = 1;
  for (int i = 0; i < top_k && miss > 0; ++i)
    miss = experts - held - i <= 0 ? 0 : miss * (experts - held - i) / (experts - i);
  return 1 - miss;
}

std::vector<std::pair<int, int>> flow_pairs(const CollectivePlan& plan) {
  std::vector<std::pair<int, int>> out;
  for (const auto& step : plan.steps)
    for_each_flow(plan, step, [&](int src, int dst) { out.emplace_back(src, dst); });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

StepCosts::Cost route_step(const Cluster& cluster, const CollectivePlan& plan, const CollectivePlan::Step& step) {
  // Flows per link, zero between calls (cleared through the touched list):
  // kept per thread, since allocating it per step costs a million-GPU
  // cluster's link count each time.
  thread_local std::vector<uint32_t> flows;
  if (flows.size() < cluster.links().size()) flows.resize(cluster.links().size(), 0);
  std::vector<LinkId> touched;
  StepCosts::Cost cost;
  for_each_flow(plan, step, [&](int src, int dst) {
    const Route r = cluster.route(src, dst);
    cost.latency = std::max(cost.latency, cluster.route_latency(r));
    cost.crosses_nodes = cost.crosses_nodes || cluster.node_of(src) != cluster.node_of(dst);
    for (LinkId l : r)
      if (flows[l]++ == 0) touched.push_back(l);
  });
  for (LinkId l : touched) {
    cost.seconds_per_byte = std::max(cost.seconds_per_byte, flows[l] / cluster.link(l).bandwidth);
    flows[l] = 0;
  }
  return cost;
}

}  // namespace

std::size_t StepCosts::KeyHash::operator()(const Key& k) const {
  std::uint64_t h = (std::uint64_t{k.group_size} << 33) ^ (std::uint64_t{k.shift} << 1) ^ k.open;
  for (int g : k.order) h = (h ^ static_cast<std::uint64_t>(g)) * 0x100000001b3ULL;
  return static_cast<std::size_t>(h);
}

StepCosts::Cost StepCosts::get(const Cluster& cluster, const CollectivePlan& plan, const CollectivePlan::Step& step) {
  Key key{plan.orders[step.order], step.group_size, step.shift, step.open};
  if (auto it = costs_.find(key); it != costs_.end()) return it->second;
  const Cost cost = route_step(cluster, plan, step);
  costs_.emplace(std::move(key), cost);
  return cost;
}

Time analytic_time(const Cluster& cluster, const CostConstants& c, const CollectivePlan& plan, StepCosts* costs) {
  Time total = 0;
  for (std::size_t i = 0; i < plan.steps.size();) {
    Time alpha = 0, latency = 0, transfer = 0;  // over the steps that start together (with_next)
    const int repeats = plan.steps[i].repeats;
    bool joined = true;
    for (; i < plan.steps.size() && joined; ++i) {
      const auto& step = plan.steps[i];
      const StepCosts::Cost k = costs != nullptr ? costs->get(cluster, plan, step) : route_step(cluster, plan, step);
      alpha = std::max(alpha, step_alpha(c, step, k.crosses_nodes));
      latency = std::max(latency, k.latency);
      transfer = std::max(transfer, from_seconds(step.bytes * k.seconds_per_byte));
      joined = step.with_next;
    }
    total += repeats * (alpha + latency + transfer);
  }
  return total;
}

Result<CollectivePlan> plan_collective(const Cluster& cluster, const CostConstants& c,
                                       const CollectiveRequest& req, StepCosts* costs) {
  const char* kind = collective_kind_name(req.kind);
  if (!(req.bytes >= 0) || !std::isfinite(req.bytes))
    return make_error("{}: bytes must be a finite number >= 0, got {}", kind, req.bytes);
  if (req.members.empty()) return make_error("{}: no members", kind);
  for (int g : req.members)
    if (!cluster.valid_gpu(g))
      return make_error("{}: member GPU {} is not in the cluster (0..{})", kind, g,
                        cluster.num_gpus() - 1);
  std::vector<int> sorted = req.members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return make_error("{}: member GPU {} appears twice", kind,
                      *std::adjacent_find(sorted.begin(), sorted.end()));
  if (req.kind == CollectiveKind::kSendRecv && req.members.size() != 2)
    return make_error("send_recv: needs exactly 2 members (src, dst), got {}", req.members.size());
  if (req.root < 0 || req.root >= static_cast<int>(req.members.size()))
    return make_error("{}: root index {} is not a member index (0..{})", kind, req.root,
                      req.members.size() - 1);
  if (!fits(req.kind, req.algorithm))
    return make_error("{}: algorithm '{}' does not apply (use auto)", kind,
                      algorithm_name(req.algorithm));
  MT_ASSIGN(CollectivePlan plan, choose_plan(cluster, c, req, costs));
  for (std::size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].with_next && (plan.steps[i].repeats != 1 || i + 1 == plan.steps.size() ||
                                    plan.steps[i + 1].repeats != 1))
      return make_error("internal: {} step {} starts with the next but repeats or is last", kind, i);
  if (cluster.has_failures()) {
    Status reachable = ok_status();
    for (const auto& step : plan.steps)
      for_each_flow(plan, step, [&](int src, int dst) {
        if (reachable.ok()) reachable = cluster.check_route(src, dst);
      });
    MT_TRY(reachable);
  }
  return plan;
}

namespace {

Result<CollectivePlan> choose_plan(const Cluster& cluster, const CostConstants& c,
                                   const CollectiveRequest& req, StepCosts* costs) {
  if (req.algorithm != Algorithm::kAuto) return expand(cluster, c, req, req.algorithm);
  const bool reduction_or_gather = req.kind == CollectiveKind::kAllReduce ||
                                   req.kind == CollectiveKind::kReduceScatter ||
                                   req.kind == CollectiveKind::kAllGather;
  if (runs_host_collectives(cluster) && reduction_or_gather)
    return expand(cluster, c, req,
                  use_hierarchical(member_nodes(cluster, req.members), req.bytes) ? Algorithm::kHierarchical
                                                                                  : Algorithm::kDirect);

  std::vector<Algorithm> candidates;
  switch (req.kind) {
    case CollectiveKind::kAllReduce:
      candidates = {Algorithm::kRing, Algorithm::kTree, Algorithm::kHierarchical, Algorithm::kNvls};
      break;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      candidates = {Algorithm::kRing, Algorithm::kHierarchical};
      break;
    case CollectiveKind::kBroadcast:
      candidates = {Algorithm::kRing};
      break;
    case CollectiveKind::kAllToAll:
      candidates = {req.experts > 0 ? Algorithm::kDeduplicated : Algorithm::kPairwise};
      break;
    case CollectiveKind::kSendRecv:
      candidates = {Algorithm::kDirect};
      break;
  }
  if (candidates.size() == 1) return expand(cluster, c, req, candidates[0]);
  std::optional<CollectivePlan> best;
  Time best_time = std::numeric_limits<Time>::max();
  for (Algorithm a : candidates) {
    auto plan = expand(cluster, c, req, a);
    if (!plan.ok()) continue;  // e.g. hierarchical on one node: not applicable
    const Time t = analytic_time(cluster, c, *plan, costs);
    if (t < best_time) {
      best_time = t;
      best = std::move(*plan);
    }
  }
  return std::move(*best);  // ring always expands
}

}  // namespace

CollectiveResult make_collective_result(const CollectiveRequest& req, Algorithm a, Time duration) {
  CollectiveResult r;
  r.algorithm = a;
  r.duration = duration;
  if (duration > 0) {
    r.algbw = req.bytes / to_seconds(duration);
    r.busbw = r.algbw * busbw_factor(req.kind, static_cast<int>(req.members.size()));
  }
  return r;
}

CollectiveEngine::CollectiveEngine(Simulator& sim, Network& network, const CostConstants& c)
    : sim_(sim), network_(network), constants_(c), cache_(1024) {}

Result<std::pair<Algorithm, Time>> CollectiveEngine::analytic(const CollectiveRequest& req) {
  uint64_t h = static_cast<uint64_t>(req.kind) * 31 + static_cast<uint64_t>(req.algorithm);
  h = h * 1000003 + static_cast<uint64_t>(req.bytes) + static_cast<uint64_t>(req.root) * 7;
  for (int g : req.members) h = h * 1000003 + static_cast<uint64_t>(g);
  h = h * 31 + static_cast<uint64_t>(req.experts) * 7 + static_cast<uint64_t>(req.top_k);
  auto& bucket = cache_[h % cache_.size()];
  for (const auto& e : bucket)
    if (e.kind == req.kind && e.requested == req.algorithm && e.bytes == req.bytes &&
        e.root == req.root && e.members == req.members && e.experts == req.experts && e.top_k == req.top_k)
      return std::make_pair(e.chosen, e.time);
  MT_ASSIGN(CollectivePlan plan, plan_collective(network_.cluster(), constants_, req, &step_costs_));
  Time t = analytic_time(network_.cluster(), constants_, plan, &step_costs_);
  const int n = static_cast<int>(req.members.size());
  // A calibration measures NCCL's all-to-all, not a deduplicating dispatcher's.
  if (calibration_ && n > 1 && req.bytes > 0 && plan.algorithm != Algorithm::kDeduplicated)
    if (auto busbw = calibration_->collective_busbw(req.kind, n, req.bytes))
      t = from_seconds(req.bytes * busbw_factor(req.kind, n) / *busbw);
  bucket.push_back(
      {req.kind, req.algorithm, req.bytes, req.root, req.members, req.experts, req.top_k, plan.algorithm, t});
  return std::make_pair(plan.algorithm, t);
}

Result<Algorithm> CollectiveEngine::start(const CollectiveRequest& req, CollectiveMode mode,
                                          EventHandler* done, uint64_t tag) {
  if (mode == CollectiveMode::kAnalytic) {
    MT_ASSIGN(auto at, analytic(req));
    sim_.schedule(sim_.now() + at.second, done, tag);
    return at.first;
  }
  MT_ASSIGN(CollectivePlan plan, plan_collective(network_.cluster(), constants_, req, &step_costs_));
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<uint32_t>(running_.size());
    running_.emplace_back();
  }
  Running& r = running_[id];
  const Algorithm a = plan.algorithm;
  r.plan = std::move(plan);
  r.step = 0;
  r.repeat = 0;
  r.outstanding = 0;
  r.done = done;
  r.tag = tag;
  begin_step(id);
  return a;
}

// Tags: (id << 1) | 0 = α elapsed, launch the step's flows; | 1 = a flow arrived.
void CollectiveEngine::begin_step(uint32_t id) {
  Running& r = running_[id];
  while (r.step < r.plan.steps.size() && r.repeat >= r.plan.steps[r.step].repeats) {
    ++r.step;
    r.repeat = 0;
  }
  if (r.step == r.plan.steps.size()) {
    sim_.schedule(sim_.now(), r.done, r.tag);
    r.plan = {};
    free_.push_back(id);
    return;
  }
  Time alpha = 0;  // the largest of the steps that start together (with_next)
  const Cluster& cluster = network_.cluster();
  for (std::size_t i = r.step; i < r.plan.steps.size(); ++i) {
    const auto& step = r.plan.steps[i];
    bool crosses = false;
    for_each_flow(r.plan, step, [&](int src, int dst) { crosses = crosses || cluster.node_of(src) != cluster.node_of(dst); });
    alpha = std::max(alpha, step_alpha(constants_, step, crosses));
    if (!step.with_next) break;
  }
  sim_.schedule(sim_.now() + alpha, this, static_cast<uint64_t>(id) << 1);
}

void CollectiveEngine::launch_flows(uint32_t id) {
  Running& r = running_[id];
  const uint64_t tag = (static_cast<uint64_t>(id) << 1) | 1;
  for (;; ++r.step) {  // ends on the last step that starts with this one
    const auto& step = r.plan.steps[r.step];
    for_each_flow(r.plan, step, [&](int src, int dst) {
      ++r.outstanding;
      network_.start_flow(src, dst, step.bytes, this, tag);
    });
    if (!step.with_next || r.step + 1 == r.plan.steps.size()) break;
  }
  if (r.outstanding == 0) {
    ++r.repeat;
    begin_step(id);
  }
}

void CollectiveEngine::on_event(Simulator& sim, uint64_t tag) {
  const uint32_t id = static_cast<uint32_t>(tag >> 1);
  if ((tag & 1) == 0) {
    launch_flows(id);
    return;
  }
  Running& r = running_[id];
  if (--r.outstanding == 0) {
    ++r.repeat;
    begin_step(id);
  }
}

Result<CollectiveResult> simulate_collective(const Cluster& cluster, const CostConstants& c,
                                             const CollectiveRequest& req, CollectiveMode mode) {
  struct Done : EventHandler {
    Time at = -1;
    void on_event(Simulator& s, uint64_t) override { at = s.now(); }
  } done;
  Simulator sim;
  Network net(sim, cluster);
  CollectiveEngine engine(sim, net, c);
  MT_ASSIGN(Algorithm a, engine.start(req, mode, &done, 0));
  sim.run();
  return make_collective_result(req, a, done.at);
}

}  // namespace meshtrain::sim
