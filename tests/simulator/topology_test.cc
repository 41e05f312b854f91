#include "simulator/topology.h"

#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/filtered_graph.hpp>
#include <catch2/catch.hpp>
#include <algorithm>
#include <ctime>
#include <functional>
#include <set>

#include "simulator/event_queue.h"

using namespace meshtrain::sim;

namespace {

struct Log : EventHandler {
  std::vector<std::pair<Time, uint64_t>> seen;
  void on_event(Simulator& s, uint64_t tag) override { seen.push_back({s.now(), tag}); }
};

Cluster make(const std::string& preset, int gpus) {
  auto spec = cluster_preset(preset);
  REQUIRE(spec.ok());
  auto c = Cluster::build(*spec, gpus);
  REQUIRE(c.ok());
  return std::move(c).value();
}

}  // namespace

TEST_CASE("events run by time, then by insertion order", "[simulator][events]") {
  Simulator sim;
  Log log;
  sim.schedule(30, &log, 1);
  sim.schedule(10, &log, 2);
  sim.schedule(30, &log, 3);
  sim.schedule(10, &log, 4);
  REQUIRE(sim.run() == 4);
  std::vector<std::pair<Time, uint64_t>> want = {{10, 2}, {10, 4}, {30, 1}, {30, 3}};
  CHECK(log.seen == want);
  // A second simulator in the same process has its own clock.
  Simulator other;
  CHECK(other.now() == 0);
  CHECK(sim.now() == 30);
}

TEST_CASE("seconds convert to picoseconds rounding up", "[simulator][events]") {
  CHECK(from_seconds(1.0) == kSecond);
  CHECK(from_seconds(1e-12) == 1);
  CHECK(from_seconds(0.4e-12) == 1);
  CHECK(from_seconds(0) == 0);
}

TEST_CASE("presets have the documented node and link counts", "[simulator][topology]") {
  for (const auto& name : cluster_preset_names()) {
    auto spec = *cluster_preset(name);
    const int gpus = 20;  // 3 nodes, the last one half full
    Cluster c = make(name, gpus);
    const int nodes = 3;
    const int leaves = 1 * spec.gpus_per_node;  // all three nodes sit under one leaf per rail
    CHECK(c.num_nodes() == nodes);
    CHECK(c.count(NodeKind::kGpu) == gpus);
    CHECK(c.count(NodeKind::kNvSwitch) == nodes);
    CHECK(c.count(NodeKind::kPcie) == nodes * spec.gpus_per_node / spec.gpus_per_pcie_switch);
    CHECK(c.count(NodeKind::kNic) == gpus);
    CHECK(c.count(NodeKind::kLeaf) == leaves);
    CHECK(c.count(NodeKind::kSpine) == spec.spines);
    // Per GPU: NVLink, GPU-PCIe, PCIe-NIC, NIC-leaf, each both directions.
    const size_t links = 8u * gpus + 2u * leaves * spec.spines;
    CHECK(c.links().size() == links);
    CHECK(boost::num_edges(c.graph()) == links);
  }
  SECTION("one node has no network switches") {
    Cluster c = make("dgx-a100", 8);
    CHECK(c.count(NodeKind::kLeaf) == 0);
    CHECK(c.count(NodeKind::kSpine) == 0);
    CHECK(c.links().size() == 6u * 8);
  }
  SECTION("preset device specs") {
    auto a = *cluster_preset("dgx-a100");
    CHECK(a.device.peak_bf16_flops == 312e12);
    CHECK(a.nvlink_bandwidth == 300e9);
    CHECK(a.nic_bandwidth == 25e9);  // 200 Gb/s
    auto h = *cluster_preset("dgx-h100");
    CHECK(h.nvlink_bandwidth == 450e9);
    CHECK(h.nic_bandwidth == 50e9);  // 400 Gb/s
    auto h2 = *cluster_preset("h200");
    CHECK(h2.device.memory_bytes == 141e9);
    CHECK(h2.device.memory_bandwidth == 4.8e12);
    CHECK(h2.device.peak_bf16_flops == h.device.peak_bf16_flops);
  }
}

TEST_CASE("routes are shortest paths and ECMP is deterministic", "[simulator][topology]") {
  auto spec = *cluster_preset("dgx-h100");
  spec.nodes_per_leaf = 2;  // 4 nodes -> 2 leaf groups, so some pairs cross the spines
  auto built = Cluster::build(spec, 32);
  REQUIRE(built.ok());
  const Cluster& c = *built;
  const size_t V = boost::num_vertices(c.graph());
  std::set<LinkId> spine_links;
  for (int src : {0, 5, 9, 31}) {
    for (int dst = 0; dst < c.num_gpus(); ++dst) {
      // Shortest paths under the routing policy: GPUs do not forward, and a
      // GPU uses its own rail's NIC (not the one of its PCIe-switch neighbour).
      auto allowed = [&](const Graph::edge_descriptor& e) {
        const Vertex& from = c.graph()[boost::source(e, c.graph())];
        const Vertex& to = c.graph()[boost::target(e, c.graph())];
        if (from.kind == NodeKind::kGpu && from.index != src) return false;
        if (from.kind == NodeKind::kPcie && to.kind == NodeKind::kNic) return to.index == src;
        if (from.kind == NodeKind::kNic && to.kind == NodeKind::kPcie) return from.index == dst;
        return true;
      };
      boost::filtered_graph<Graph, std::function<bool(const Graph::edge_descriptor&)>> g(
          c.graph(), std::function<bool(const Graph::edge_descriptor&)>(allowed));
      std::vector<int> dist(V, 0);
      boost::breadth_first_search(g, c.gpu_vertex(src),
                                  boost::visitor(boost::make_bfs_visitor(boost::record_distances(
                                      dist.data(), boost::on_tree_edge()))));
      Route r = c.route(src, dst);
      CHECK(static_cast<int>(r.size) == dist[dst]);
      // The route is a connected walk from src to dst.
      uint32_t at = c.gpu_vertex(src);
      for (LinkId l : r) {
        CHECK(c.link(l).from == at);
        at = c.link(l).to;
      }
      CHECK(at == c.gpu_vertex(dst));
      Route again = c.route(src, dst);
      CHECK(std::equal(r.begin(), r.end(), again.begin(), again.end()));
      for (LinkId l : r)
        if (c.graph()[c.link(l).from].kind == NodeKind::kLeaf &&
            c.graph()[c.link(l).to].kind == NodeKind::kSpine)
          spine_links.insert(l);
    }
  }
  // Different pairs spread over several spines.
  CHECK(spine_links.size() > 4);
}

// Building scales with the cluster, not with its square: 4x the GPUs take
// under 8x the time (linear 4x, quadratic 16x; measured 3.3-4.4x). Timed in
// this process's CPU time (std::clock), each the best of three: on a loaded
// machine a build of a few ms is mostly off the CPU, and its wall time varied
// 3-46 ms for 4096 GPUs while its CPU time stayed at 3.4-5.1 ms. Absolute
// times at scale are bench_sim_scale's (experiments/bench) to measure.
TEST_CASE("a 16384-GPU cluster builds in time linear in its size", "[simulator][topology]") {
  const auto spec = *cluster_preset("dgx-h100");
  auto best_build_s = [&](int gpus) {
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      const std::clock_t t0 = std::clock();
      auto c = Cluster::build(spec, gpus);
      best = std::min(best, static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC);
      REQUIRE(c.ok());
    }
    return best;
  };
  const double small = best_build_s(4096), large = best_build_s(16384);
  auto c = Cluster::build(spec, 16384);
  REQUIRE(c.ok());
  INFO("16384-GPU dgx-h100 topology: " << c->links().size() << " links, " << boost::num_vertices(c->graph())
                                       << " vertices, built in " << large * 1e3 << " ms; 4096 GPUs in "
                                       << small * 1e3 << " ms");
  CHECK(c->num_nodes() == 2048);
  CHECK(c->num_leaves() == 64 * 8);
  CHECK(large < 8 * small);
}

TEST_CASE("cluster JSON: valid files and clear errors", "[simulator][topology]") {
  auto ok = cluster_spec_from_json(R"({"base": "dgx-a100", "name": "thin", "oversubscription": 2,
                                       "nodes_per_leaf": 4, "device": {"memory_GiB": 40}})");
  REQUIRE(ok.ok());
  CHECK(ok->name == "thin");
  CHECK(ok->oversubscription == 2);
  CHECK(ok->device.memory_bytes == 40.0 * (1 << 30));
  CHECK(ok->nvlink_bandwidth == 300e9);  // inherited
  {
    // Uplinks carry half of what the leaf's 4 downlinks do, over 20 spines.
    auto c = Cluster::build(*ok, 64);
    REQUIRE(c.ok());
    Route r = c->route(0, 63);  // node 0 -> node 7: different leaf group
    REQUIRE(r.size == 8);
    CHECK(c->link(r.links[3]).bandwidth == Approx(25e9 * 4 / (2.0 * 20)));
  }

  auto full = cluster_spec_from_json(R"({"gpus_per_node": 4, "nvlink_GBps": 100, "pcie_GBps": 16,
      "nic_Gbps": 100, "nodes_per_leaf": 2,
      "device": {"bf16_TFLOPS": 100, "fp32_TFLOPS": 10, "memory_GiB": 16, "memory_GBps": 900}})");
  REQUIRE(full.ok());
  CHECK(full->gpus_per_node == 4);
  CHECK(full->nic_bandwidth == 12.5e9);

  auto err = [](const char* text) {
    auto r = cluster_spec_from_json(text);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(err(R"({"gpus_per_node": 8})"), Catch::Contains("missing field 'nvlink_GBps'"));
  CHECK_THAT(err(R"({"base": "dgx-a100", "nic_gbps": 200})"),
             Catch::Contains("unknown field 'nic_gbps'") && Catch::Contains("nic_Gbps"));
  CHECK_THAT(err(R"({"base": "dgx-a100", "nic_Gbps": "fast"})"),
             Catch::Contains("'nic_Gbps' must be a number"));
  CHECK_THAT(err(R"({"base": "dgx-a100", "oversubscription": 0.5})"),
             Catch::Contains("'oversubscription' must be a number in [1, 1000]"));
  CHECK_THAT(err(R"({"base": "dgx-a100", "gpus_per_node": 7})"),
             Catch::Contains("gpus_per_pcie_switch"));
  CHECK_THAT(err(R"({"base": "dgx-z"})"), Catch::Contains("unknown cluster preset 'dgx-z'"));
  CHECK_THAT(err(R"({"base": "dgx-a100", "device": {"memory_GiB": -1}})"),
             Catch::Contains("device") && Catch::Contains("memory_GiB"));
  CHECK_THAT(err("{not json"), Catch::Contains("not valid JSON"));
  auto missing = load_cluster_spec("/nonexistent/cluster.json");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.error().message(), Catch::Contains("/nonexistent/cluster.json"));
  auto bad_count = Cluster::build(*cluster_preset("dgx-a100"), 0);
  REQUIRE_FALSE(bad_count.ok());
  CHECK_THAT(bad_count.error().message(), Catch::Contains("number of GPUs"));
}
