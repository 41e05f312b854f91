// Cables by name, degraded and failed links, and routes around failures
// (topology.h, "Variation").
#include <algorithm>
#include <charconv>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "simulator/topology.h"

namespace meshtrain::sim {
namespace {

constexpr size_t kMaxHops = 16;  // Route's capacity

uint64_t mix(uint64_t x) {  // splitmix64, as topology.cc's ECMP hash
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// "<prefix><digits>" at the start of `s`: the number, and `s` advanced past it.
bool take(std::string_view& s, std::string_view prefix, int& value) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data() || value < 0) return false;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return true;
}

constexpr const char* kForms =
    "nodeN.gpuL (NVLink port), nodeN.pcieL (GPU PCIe link), nodeN.nicL (network cable of rail L), "
    "leafA-spineB (uplink)";

}  // namespace

Result<std::array<LinkId, 2>> Cluster::cable(std::string_view name) const {
  std::string_view s = name;
  int node = -1, local = -1, leaf = -1, spine = -1;
  if (take(s, "node", node) && !s.empty() && s.front() == '.') {
    s.remove_prefix(1);
    std::string_view kind = s.substr(0, s.find_first_of("0123456789"));
    if ((kind == "gpu" || kind == "pcie" || kind == "nic") && take(s, kind, local) && s.empty()) {
      if (node >= num_nodes_)
        return make_error("link '{}': node {} is not in the cluster (nodes 0..{})", name, node, num_nodes_ - 1);
      const int g = node * spec_.gpus_per_node + local;
      if (local >= spec_.gpus_per_node || g >= num_gpus_)
        return make_error("link '{}': node {} has no GPU {} (it holds {})", name, node, local,
                          std::min(spec_.gpus_per_node, num_gpus_ - node * spec_.gpus_per_node));
      if (kind == "gpu") return std::array<LinkId, 2>{gpu_nvs_[g], nvs_gpu_[g]};
      if (kind == "pcie") return std::array<LinkId, 2>{gpu_pcie_[g], pcie_gpu_[g]};
      if (num_nodes_ == 1)
        return make_error("link '{}': a one-node cluster has no network cables", name);
      return std::array<LinkId, 2>{nic_leaf_[g], leaf_nic_[g]};
    }
  } else {
    s = name;
    const bool leaf_first = take(s, "leaf", leaf) && !s.empty() && s.front() == '-' &&
                            (s.remove_prefix(1), take(s, "spine", spine)) && s.empty();
    s = name;
    const bool spine_first = !leaf_first && take(s, "spine", spine) && !s.empty() && s.front() == '-' &&
                             (s.remove_prefix(1), take(s, "leaf", leaf)) && s.empty();
    if (leaf_first || spine_first) {
      if (leaf >= num_leaves_ || spine >= num_spines_)
        return make_error("link '{}': the cluster has leaves 0..{} and spines 0..{}", name,
                          num_leaves_ - 1, num_spines_ - 1);
      const size_t i = static_cast<size_t>(leaf) * num_spines_ + spine;
      return std::array<LinkId, 2>{leaf_spine_[i], spine_leaf_[i]};
    }
  }
  return make_error("unknown link '{}'; links are named {}", name, kForms);
}

int Cluster::node_of_vertex(uint32_t v) const {
  const Vertex& x = (*graph_)[v];
  const int gpn = spec_.gpus_per_node;
  switch (x.kind) {
    case NodeKind::kGpu:
    case NodeKind::kNic:
      return x.index / gpn;
    case NodeKind::kNvSwitch:
      return x.index;
    case NodeKind::kPcie:
      return x.index / (gpn / spec_.gpus_per_pcie_switch);
    case NodeKind::kLeaf:
    case NodeKind::kSpine:
      break;
  }
  return -1;
}

std::string Cluster::link_name(LinkId id) const {
  const Link& l = links_[id];
  const Vertex& a = (*graph_)[l.from];
  const Vertex& b = (*graph_)[l.to];
  // The cable's GPU-side (or leaf-side) end names it; "up" leaves the GPU.
  const bool up = a.kind < b.kind;
  const Vertex& low = up ? a : b;
  const Vertex& high = up ? b : a;
  const char* dir = up ? "up" : "down";
  const int gpn = spec_.gpus_per_node;
  if (low.kind == NodeKind::kLeaf)
    return fmt::format("leaf{}-spine{} ({})", low.index, high.index, dir);
  if (high.kind == NodeKind::kLeaf)
    return fmt::format("node{}.nic{} ({})", low.index / gpn, low.index % gpn, dir);
  if (high.kind == NodeKind::kNvSwitch)
    return fmt::format("node{}.gpu{} ({})", low.index / gpn, low.index % gpn, dir);
  if (low.kind == NodeKind::kGpu)
    return fmt::format("node{}.pcie{} ({})", low.index / gpn, low.index % gpn, dir);
  // PCIe switch <-> NIC: named by the NIC's rail.
  return fmt::format("node{}.pcie-nic{} ({})", high.index / gpn, high.index % gpn, dir);
}

void Cluster::scale_bandwidth(LinkId id, double factor) { links_[id].bandwidth *= factor; }

void Cluster::fail(LinkId id) {
  if (failed_.empty()) failed_.assign(links_.size(), 0);
  failed_[id] = 1;
  reroutes_.clear();
}

Status Cluster::check_route(int src, int dst) const {
  if (!route(src, dst).unreachable) return ok_status();
  std::vector<std::string> down;
  for (LinkId l = 0; l < failed_.size() && down.size() < 8; l += 2)
    if (failed_[l] || failed_[l + 1]) {
      std::string n = link_name(l);
      down.push_back(n.substr(0, n.find(' ')));
    }
  const int gpn = spec_.gpus_per_node;
  return make_error(
      "no working path from GPU {} (node{}.gpu{}) to GPU {} (node{}.gpu{}) with {} down: the job "
      "stops",
      src, src / gpn, src % gpn, dst, dst / gpn, dst % gpn, fmt::join(down, ", "));
}

// Breadth-first search inside one node over working links. Forward: from
// `gpu` along links; backward: towards `gpu` against links (entering).
// Calls found(vertex, path-in-travel-order) for every vertex reached, in
// order of distance. Links come in pairs (add_link is called for a link
// and then its reverse), so the reverse of link l is l ^ 1.
namespace {

template <class NodeOf, class Found>
void node_bfs(const Graph& g, const std::vector<uint8_t>& failed, uint32_t start, int node,
              bool forward, NodeOf&& node_of, Found&& found) {
  std::vector<std::pair<uint32_t, std::vector<LinkId>>> frontier{{start, {}}};
  std::vector<uint32_t> seen{start};
  while (!frontier.empty()) {
    std::vector<std::pair<uint32_t, std::vector<LinkId>>> next;
    for (auto& [v, path] : frontier) {
      auto [e, end] = boost::out_edges(v, g);
      for (; e != end; ++e) {
        const uint32_t u = static_cast<uint32_t>(boost::target(*e, g));
        const LinkId out = g[*e].id;
        const LinkId travel = forward ? out : (out ^ 1u);  // entering: the link u -> v
        if (failed[travel] || node_of(u) != node) continue;
        if (std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
        seen.push_back(u);
        std::vector<LinkId> p = path;
        if (forward) p.push_back(travel);
        else p.insert(p.begin(), travel);
        found(u, p);
        next.emplace_back(u, std::move(p));
      }
    }
    frontier = std::move(next);
  }
}

}  // namespace

std::vector<LinkId> Cluster::node_path(int src, int dst) const {
  std::vector<LinkId> out;
  bool done = false;
  node_bfs(*graph_, failed_, gpu_vertex(src), node_of(src), true,
           [this](uint32_t v) { return node_of_vertex(v); },
           [&](uint32_t v, const std::vector<LinkId>& p) {
             if (!done && v == gpu_vertex(dst)) {
               out = p;
               done = true;
             }
           });
  return out;
}

Route Cluster::reroute(int src, int dst) const {
  const uint64_t key = static_cast<uint64_t>(src) * static_cast<uint64_t>(num_gpus_) + dst;
  if (auto it = reroutes_.find(key); it != reroutes_.end()) return it->second;
  Route r;
  auto store = [&](const std::vector<LinkId>& links) {
    for (LinkId l : links) r.push(l);
  };
  const int gpn = spec_.gpus_per_node;
  std::vector<LinkId> inside = node_of(src) == node_of(dst) ? node_path(src, dst) : std::vector<LinkId>{};
  if (!inside.empty() && inside.size() <= kMaxHops) {
    store(inside);
  } else if (num_nodes_ > 1) {
    // Every NIC each end can reach inside its node, with its path; then the
    // shortest combination (ties: each end's own rail, then the lowest NICs).
    struct End {
      int nic;
      std::vector<LinkId> path;
    };
    std::vector<End> exits, entries;
    node_bfs(*graph_, failed_, gpu_vertex(src), node_of(src), true,
             [this](uint32_t v) { return node_of_vertex(v); },
             [&](uint32_t v, const std::vector<LinkId>& p) {
               const Vertex& x = (*graph_)[v];
               if (x.kind == NodeKind::kNic && !failed_[nic_leaf_[x.index]]) exits.push_back({x.index, p});
             });
    node_bfs(*graph_, failed_, gpu_vertex(dst), node_of(dst), false,
             [this](uint32_t v) { return node_of_vertex(v); },
             [&](uint32_t v, const std::vector<LinkId>& p) {
               const Vertex& x = (*graph_)[v];
               if (x.kind == NodeKind::kNic && !failed_[leaf_nic_[x.index]]) entries.push_back({x.index, p});
             });
    auto leaf_of = [&](int nic) { return (nic / gpn / spec_.nodes_per_leaf) * gpn + nic % gpn; };
    using Rank = std::tuple<size_t, bool, bool, int, int>;
    std::optional<Rank> best;
    const End* bx = nullptr;
    const End* by = nullptr;
    std::vector<int> spines;
    for (const End& x : exits)
      for (const End& y : entries) {
        if (x.nic == y.nic) continue;  // a switch does not send back out of the port it received on
        const int lx = leaf_of(x.nic), ly = leaf_of(y.nic);
        size_t core = 2;
        if (lx != ly) {
          core = 4;
          bool any = false;
          for (int s = 0; s < num_spines_ && !any; ++s)
            any = !failed_[leaf_spine_[static_cast<size_t>(lx) * num_spines_ + s]] &&
                  !failed_[spine_leaf_[static_cast<size_t>(ly) * num_spines_ + s]];
          if (!any) continue;
        }
        const size_t hops = x.path.size() + y.path.size() + core;
        if (hops > kMaxHops) continue;
        const Rank rank{hops, x.nic % gpn != src % gpn, y.nic % gpn != dst % gpn, x.nic, y.nic};
        if (!best || rank < *best) {
          best = rank;
          bx = &x;
          by = &y;
        }
      }
    if (best) {
      store(bx->path);
      r.push(nic_leaf_[bx->nic]);
      const int lx = leaf_of(bx->nic), ly = leaf_of(by->nic);
      if (lx != ly) {
        for (int s = 0; s < num_spines_; ++s)
          if (!failed_[leaf_spine_[static_cast<size_t>(lx) * num_spines_ + s]] &&
              !failed_[spine_leaf_[static_cast<size_t>(ly) * num_spines_ + s]])
            spines.push_back(s);
        const size_t s = static_cast<size_t>(spines[mix(key) % spines.size()]);
        r.push(leaf_spine_[static_cast<size_t>(lx) * num_spines_ + s]);
        r.push(spine_leaf_[static_cast<size_t>(ly) * num_spines_ + s]);
      }
      r.push(leaf_nic_[by->nic]);
      store(by->path);
    } else {
      r.unreachable = true;
    }
  } else {
    r.unreachable = true;
  }
  reroutes_.emplace(key, r);
  return r;
}

}  // namespace meshtrain::sim
