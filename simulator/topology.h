// The cluster as a graph: vertices are GPUs, NVSwitch fabrics, PCIe
// switches, NICs, leaf and spine switches; edges are one direction of a
// full-duplex link (so each physical cable is two edges with their own
// bandwidth). The shape is described in cluster_spec.h.
//
// Links have dense integer ids (LinkId); the network model keeps its per-link
// state in flat arrays indexed by them. The Boost.Graph `graph()` is the same
// structure for algorithms that want a graph (tests check routes against its
// breadth-first distances).
//
// Routing is deterministic up*/down* routing on the fat tree, which gives a
// shortest path:
//   same node:     GPU -> NVSwitch -> GPU                               (2 hops)
//   same leaf:     GPU -> PCIe -> NIC -> leaf -> NIC -> PCIe -> GPU     (6 hops)
//   otherwise:     ... -> leaf -> spine -> leaf -> ...                  (8 hops)
// Between two leaves every spine is an equal-cost path; ECMP picks
// spine = hash(src, dst) mod spines (splitmix64), the same every run, and
// different pairs spread over the spines. Cross-rail traffic between nodes
// goes over the spines (no PXN-style NVLink forwarding).
//
// Cost: a 16384-GPU cluster has ~43k vertices and ~160k links; routes are
// computed arithmetically in O(hops) with no search and no per-pair cache.
//
// Variation (what-ifs; link_faults.cc): a cable is named by its endpoints,
//   nodeN.gpuL     GPU L's NVLink port on node N (GPU <-> NVSwitch)
//   nodeN.pcieL    GPU L's PCIe link (GPU <-> its PCIe switch)
//   nodeN.nicL     the network cable of rail L on node N (NIC <-> leaf)
//   leafA-spineB   an uplink (also written spineB-leafA)
// with leaves numbered group · gpus_per_node + rail. A cable can be degraded
// (both directions keep a fraction of their bandwidth) or failed. With a
// failed cable on its route, a pair is rerouted: inside a node by a shortest
// path over the node's working links (through the PCIe switch to a sibling
// GPU's NIC, or over NVLink through another GPU, as NCCL's PXN forwards),
// leaving by the nearest working NIC and entering by the one nearest the
// destination (the exit's rail first, so the detour avoids the spines when
// it can), and between leaves over an ECMP choice among the spines whose
// both uplinks work. A pair with no working path is unreachable: the job
// stops (check_route says so, naming the failed cables). Rerouted pairs are
// computed once and cached.
#pragma once

#include <array>
#include <memory>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "simulator/cluster_spec.h"

namespace meshtrain::sim {

enum class NodeKind : uint8_t { kGpu, kNvSwitch, kPcie, kNic, kLeaf, kSpine };
const char* node_kind_name(NodeKind kind);

using LinkId = uint32_t;

struct Vertex {
  NodeKind kind;
  int32_t index;  // index among vertices of its kind (e.g. the global GPU id)
};
struct Edge {
  LinkId id = 0;
};
// Built once from the link list and never changed (failures live in
// Cluster::failed_), so a compressed sparse row graph: a few flat arrays,
// which a million-GPU cluster builds and frees in a fraction of a second.
using Graph = boost::compressed_sparse_row_graph<boost::directedS, Vertex, Edge, boost::no_property, uint32_t, uint32_t>;

struct Link {
  double bandwidth;  // bytes/s in this direction
  Time latency;      // one hop
  uint32_t from;     // graph vertex ids
  uint32_t to;
};

// A route is at most 8 hops (see above); rerouted around failures, 4
// through the network and up to 6 inside each node. Fixed capacity keeps it
// off the heap.
struct Route {
  std::array<LinkId, 16> links{};
  uint8_t size = 0;
  bool unreachable = false;  // no working path (failed links): size is 0
  const LinkId* begin() const { return links.data(); }
  const LinkId* end() const { return links.data() + size; }
  void push(LinkId l) { links[size++] = l; }
};

class Cluster {
 public:
  // A cluster of `num_gpus` GPUs: ceil(num_gpus / gpus_per_node) nodes, the
  // last one partly filled. Leaves and spines exist only with >1 node.
  static Result<Cluster> build(const ClusterSpec& spec, int num_gpus);

  const ClusterSpec& spec() const { return spec_; }
  int num_gpus() const { return num_gpus_; }
  int num_nodes() const { return num_nodes_; }
  int gpus_per_node() const { return spec_.gpus_per_node; }
  int node_of(int gpu) const { return gpu / spec_.gpus_per_node; }
  int local_rank(int gpu) const { return gpu % spec_.gpus_per_node; }
  int num_leaves() const { return num_leaves_; }
  int num_spines() const { return num_spines_; }
  int count(NodeKind kind) const;

  const Graph& graph() const { return *graph_; }
  const std::vector<Link>& links() const { return links_; }
  const Link& link(LinkId id) const { return links_[id]; }
  uint32_t gpu_vertex(int gpu) const { return static_cast<uint32_t>(gpu); }

  // Shortest route src -> dst (empty when src == dst), around failed links
  // (see above; `unreachable` when there is none). Both must be valid GPU
  // ids; callers check with valid_gpu() first.
  Route route(int src_gpu, int dst_gpu) const;
  // An Error naming the pair and the failed cables when src cannot reach dst.
  Status check_route(int src_gpu, int dst_gpu) const;

  // ---- variation (link_faults.cc) ----
  // The two directions of the cable called `name` (forms above); an Error
  // listing the forms, or saying which index is out of range.
  Result<std::array<LinkId, 2>> cable(std::string_view name) const;
  // "node3.nic5 (up)": a link's cable name and direction, for messages.
  std::string link_name(LinkId id) const;
  // Multiplies the bandwidth of `id` by `factor` (> 0).
  void scale_bandwidth(LinkId id, double factor);
  // Takes `id` out of service: no route uses it from now on.
  void fail(LinkId id);
  bool failed(LinkId id) const { return !failed_.empty() && failed_[id] != 0; }
  bool has_failures() const { return !failed_.empty(); }
  bool valid_gpu(int gpu) const { return gpu >= 0 && gpu < num_gpus_; }
  // Sum of hop latencies and the smallest link bandwidth along a route.
  Time route_latency(const Route& r) const;
  double route_bandwidth(const Route& r) const;

 private:
  LinkId add_link(uint32_t from, uint32_t to, double bandwidth, Time latency);
  Route direct_route(int src, int dst) const;  // the fault-free route
  Route reroute(int src, int dst) const;       // around failed links
  std::vector<LinkId> node_path(int src, int dst) const;  // GPU to GPU inside a node, working links
  int node_of_vertex(uint32_t v) const;                  // -1 for leaves and spines

  ClusterSpec spec_;
  int num_gpus_ = 0, num_nodes_ = 0, num_leaves_ = 0, num_spines_ = 0;
  std::array<int, 6> counts_{};
  // Built once and never changed after (failures live in failed_): copies of
  // the Cluster share it.
  std::shared_ptr<const Graph> graph_;
  std::vector<Link> links_;
  // Link ids by role, indexed by GPU id (every GPU has its own NVLink port,
  // PCIe lane group, NIC and leaf port) or by leaf * spines + spine.
  std::vector<LinkId> gpu_nvs_, nvs_gpu_, gpu_pcie_, pcie_gpu_, pcie_nic_, nic_pcie_, nic_leaf_,
      leaf_nic_, leaf_spine_, spine_leaf_;
  std::vector<uint8_t> failed_;  // by link, empty while nothing failed
  // Routes of pairs whose direct route crosses a failed link, by src · GPUs + dst.
  mutable std::unordered_map<uint64_t, Route> reroutes_;
};

}  // namespace meshtrain::sim
