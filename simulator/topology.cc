#include "simulator/topology.h"

namespace meshtrain::sim {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kGpu:
      return "gpu";
    case NodeKind::kNvSwitch:
      return "nvswitch";
    case NodeKind::kPcie:
      return "pcie";
    case NodeKind::kNic:
      return "nic";
    case NodeKind::kLeaf:
      return "leaf";
    case NodeKind::kSpine:
      return "spine";
  }
  return "?";
}

LinkId Cluster::add_link(uint32_t from, uint32_t to, double bandwidth, Time latency) {
  LinkId id = static_cast<LinkId>(links_.size());
  links_.push_back(Link{bandwidth, latency, from, to});
  return id;
}

int Cluster::count(NodeKind kind) const { return counts_[static_cast<int>(kind)]; }

Result<Cluster> Cluster::build(const ClusterSpec& spec, int num_gpus) {
  MT_TRY(validate(spec).context(fmt::format("cluster '{}'", spec.name)));
  if (num_gpus < 1 || num_gpus > (1 << 24))
    return make_error("cluster '{}': number of GPUs must be in [1, 16777216], got {}", spec.name,
                      num_gpus);
  Cluster c;
  c.spec_ = spec;
  const int gpn = spec.gpus_per_node;
  const int per_pcie = spec.gpus_per_pcie_switch;
  c.num_gpus_ = num_gpus;
  c.num_nodes_ = (num_gpus + gpn - 1) / gpn;
  const int groups = (c.num_nodes_ + spec.nodes_per_leaf - 1) / spec.nodes_per_leaf;
  const bool network = c.num_nodes_ > 1;
  c.num_leaves_ = network ? groups * gpn : 0;
  c.num_spines_ = network ? (spec.spines > 0 ? spec.spines : spec.nodes_per_leaf) : 0;

  // Vertex ids: GPUs first so gpu_vertex(g) == g.
  std::vector<Vertex> vertices;
  auto add_vertex = [&](NodeKind kind, int index) {
    ++c.counts_[static_cast<int>(kind)];
    vertices.push_back(Vertex{kind, index});
    return static_cast<uint32_t>(vertices.size() - 1);
  };
  for (int g = 0; g < num_gpus; ++g) add_vertex(NodeKind::kGpu, g);
  std::vector<uint32_t> nvs(c.num_nodes_), nic(num_gpus), leaf(c.num_leaves_), spine(c.num_spines_);
  std::vector<uint32_t> pcie(static_cast<size_t>(c.num_nodes_) * (gpn / per_pcie));
  for (int n = 0; n < c.num_nodes_; ++n) nvs[n] = add_vertex(NodeKind::kNvSwitch, n);
  for (size_t p = 0; p < pcie.size(); ++p)
    pcie[p] = add_vertex(NodeKind::kPcie, static_cast<int>(p));
  for (int g = 0; g < num_gpus; ++g) nic[g] = add_vertex(NodeKind::kNic, g);
  for (int l = 0; l < c.num_leaves_; ++l) leaf[l] = add_vertex(NodeKind::kLeaf, l);
  for (int s = 0; s < c.num_spines_; ++s) spine[s] = add_vertex(NodeKind::kSpine, s);

  const size_t links_estimate =
      static_cast<size_t>(num_gpus) * 8 + 2 * static_cast<size_t>(c.num_leaves_) * c.num_spines_;
  c.links_.reserve(links_estimate);
  for (auto* v : {&c.gpu_nvs_, &c.nvs_gpu_, &c.gpu_pcie_, &c.pcie_gpu_, &c.pcie_nic_, &c.nic_pcie_,
                  &c.nic_leaf_, &c.leaf_nic_})
    v->resize(num_gpus);
  for (int g = 0; g < num_gpus; ++g) {
    const int node = g / gpn, local = g % gpn;
    const uint32_t sw = nvs[node];
    const uint32_t pc = pcie[static_cast<size_t>(node) * (gpn / per_pcie) + local / per_pcie];
    c.gpu_nvs_[g] = c.add_link(g, sw, spec.nvlink_bandwidth, spec.nvlink_latency);
    c.nvs_gpu_[g] = c.add_link(sw, g, spec.nvlink_bandwidth, spec.nvlink_latency);
    c.gpu_pcie_[g] = c.add_link(g, pc, spec.pcie_bandwidth, spec.pcie_latency);
    c.pcie_gpu_[g] = c.add_link(pc, g, spec.pcie_bandwidth, spec.pcie_latency);
    c.pcie_nic_[g] = c.add_link(pc, nic[g], spec.pcie_bandwidth, spec.pcie_latency);
    c.nic_pcie_[g] = c.add_link(nic[g], pc, spec.pcie_bandwidth, spec.pcie_latency);
    if (network) {
      const uint32_t lf = leaf[(node / spec.nodes_per_leaf) * gpn + local];
      c.nic_leaf_[g] = c.add_link(nic[g], lf, spec.nic_bandwidth, spec.nic_latency);
      c.leaf_nic_[g] = c.add_link(lf, nic[g], spec.nic_bandwidth, spec.nic_latency);
    }
  }
  if (network) {
    // A leaf's downlink bandwidth is nodes_per_leaf NIC ports; its uplinks
    // carry that divided by the oversubscription, spread over the spines.
    const double uplink =
        spec.nic_bandwidth * spec.nodes_per_leaf / (spec.oversubscription * c.num_spines_);
    c.leaf_spine_.resize(static_cast<size_t>(c.num_leaves_) * c.num_spines_);
    c.spine_leaf_.resize(c.leaf_spine_.size());
    for (int l = 0; l < c.num_leaves_; ++l)
      for (int s = 0; s < c.num_spines_; ++s) {
        const size_t i = static_cast<size_t>(l) * c.num_spines_ + s;
        c.leaf_spine_[i] = c.add_link(leaf[l], spine[s], uplink, spec.switch_latency);
        c.spine_leaf_[i] = c.add_link(spine[s], leaf[l], uplink, spec.switch_latency);
      }
  }
  // The graph in one go from the link list (compressed sparse rows: a
  // vertex's out-edges in the order their links were added).
  std::vector<std::pair<uint32_t, uint32_t>> ends;
  std::vector<Edge> ids;
  ends.reserve(c.links_.size());
  ids.reserve(c.links_.size());
  for (const Link& l : c.links_) {
    ids.push_back(Edge{static_cast<LinkId>(ends.size())});
    ends.emplace_back(l.from, l.to);
  }
  auto graph = std::make_shared<Graph>(boost::edges_are_unsorted_multi_pass, ends.begin(), ends.end(), ids.begin(),
                                       vertices.size());
  for (std::size_t v = 0; v < vertices.size(); ++v) (*graph)[static_cast<uint32_t>(v)] = vertices[v];
  c.graph_ = std::move(graph);
  return c;
}

Route Cluster::route(int src, int dst) const {
  Route r = direct_route(src, dst);
  if (failed_.empty()) return r;
  for (LinkId l : r)
    if (failed_[l]) return reroute(src, dst);
  return r;
}

Route Cluster::direct_route(int src, int dst) const {
  Route r;
  if (src == dst) return r;
  const int gpn = spec_.gpus_per_node;
  if (src / gpn == dst / gpn) {
    r.push(gpu_nvs_[src]);
    r.push(nvs_gpu_[dst]);
    return r;
  }
  r.push(gpu_pcie_[src]);
  r.push(pcie_nic_[src]);
  r.push(nic_leaf_[src]);
  const int leaf_src = (src / gpn / spec_.nodes_per_leaf) * gpn + src % gpn;
  const int leaf_dst = (dst / gpn / spec_.nodes_per_leaf) * gpn + dst % gpn;
  if (leaf_src != leaf_dst) {
    const uint64_t key = (static_cast<uint64_t>(src) << 32) | static_cast<uint32_t>(dst);
    const size_t s = splitmix64(key) % static_cast<uint64_t>(num_spines_);
    r.push(leaf_spine_[static_cast<size_t>(leaf_src) * num_spines_ + s]);
    r.push(spine_leaf_[static_cast<size_t>(leaf_dst) * num_spines_ + s]);
  }
  r.push(leaf_nic_[dst]);
  r.push(nic_pcie_[dst]);
  r.push(pcie_gpu_[dst]);
  return r;
}

Time Cluster::route_latency(const Route& r) const {
  Time t = 0;
  for (LinkId l : r) t += links_[l].latency;
  return t;
}

double Cluster::route_bandwidth(const Route& r) const {
  double b = 0;
  for (LinkId l : r) b = (b == 0 || links_[l].bandwidth < b) ? links_[l].bandwidth : b;
  return b;
}

}  // namespace meshtrain::sim
