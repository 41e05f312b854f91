// Cables by name, degraded and failed links, and rerouting (topology.h,
// "Variation"). Routes around failures are checked against Boost.Graph's
// breadth-first distances on the graph with the failed edges filtered out.
#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/filtered_graph.hpp>
#include <catch2/catch.hpp>

#include "simulator/network.h"
#include "simulator/topology.h"
#include "tests/simulator/executor_fixture.h"

using namespace meshtrain::sim;

namespace {

using testing::make;

// The route is a connected walk from src to dst over working links.
void check_walk(const Cluster& c, const Route& r, int src, int dst) {
  REQUIRE_FALSE(r.unreachable);
  uint32_t at = c.gpu_vertex(src);
  for (LinkId l : r) {
    CHECK_FALSE(c.failed(l));
    CHECK(c.link(l).from == at);
    at = c.link(l).to;
  }
  CHECK(at == c.gpu_vertex(dst));
}

// Boost's filtered_graph wants a default-constructible, assignable predicate.
struct Working {
  const Cluster* c = nullptr;
  bool operator()(const Graph::edge_descriptor& e) const { return !c->failed(c->graph()[e].id); }
};

// Hops of a shortest working path, from Boost's BFS on the filtered graph.
int bfs_hops(const Cluster& c, int src, int dst) {
  boost::filtered_graph<Graph, Working> g(c.graph(), Working{&c});
  std::vector<int> dist(boost::num_vertices(c.graph()), -1);
  dist[c.gpu_vertex(src)] = 0;
  boost::breadth_first_search(
      g, c.gpu_vertex(src),
      boost::visitor(boost::make_bfs_visitor(boost::record_distances(dist.data(), boost::on_tree_edge()))));
  return dist[c.gpu_vertex(dst)];
}

void fail_cable(Cluster& c, const std::string& name) {
  auto cable = c.cable(name);
  REQUIRE(cable.ok());
  for (LinkId l : *cable) c.fail(l);
}

}  // namespace

TEST_CASE("cables are named by their endpoints", "[simulator][faults]") {
  Cluster c = make("dgx-a100", 64 * 8);  // 64 nodes: 4 groups of 20 (the last partial)
  auto nic = c.cable("node3.nic5");
  REQUIRE(nic.ok());
  CHECK(c.link_name((*nic)[0]) == "node3.nic5 (up)");
  CHECK(c.link_name((*nic)[1]) == "node3.nic5 (down)");
  // Its route: GPU 29 leaves through NIC 29 to leaf (group 0, rail 5).
  const Route r = c.route(29, 21 * 8 + 5);
  CHECK(std::find(r.begin(), r.end(), (*nic)[0]) != r.end());
  auto up = c.cable("leaf2-spine7");
  REQUIRE(up.ok());
  CHECK(c.link_name((*up)[0]) == "leaf2-spine7 (up)");
  CHECK(c.link_name((*up)[1]) == "leaf2-spine7 (down)");
  CHECK(*c.cable("spine7-leaf2") == *up);
  CHECK(c.link_name((*c.cable("node0.gpu3"))[0]) == "node0.gpu3 (up)");
  CHECK(c.link_name((*c.cable("node1.pcie2"))[1]) == "node1.pcie2 (down)");

  CHECK_THAT(c.cable("node64.nic0").error().message(), Catch::Contains("node 64 is not in the cluster"));
  CHECK_THAT(c.cable("node3.nic8").error().message(), Catch::Contains("has no GPU 8"));
  CHECK_THAT(c.cable("leaf99-spine0").error().message(), Catch::Contains("leaves 0..") );
  CHECK_THAT(c.cable("nic5").error().message(),
             Catch::Contains("unknown link 'nic5'") && Catch::Contains("leafA-spineB"));
  CHECK_THAT(make("dgx-a100", 8).cable("node0.nic1").error().message(),
             Catch::Contains("a one-node cluster has no network cables"));
}

TEST_CASE("a degraded cable slows the flows over it by its factor", "[simulator][faults]") {
  Cluster c = make("dgx-h100", 16);
  const double before = c.route_bandwidth(c.route(3, 11));
  const auto cable = c.cable("node0.nic3");  // kept: a range-for over *c.cable(...) reads a destroyed Result
  REQUIRE(cable.ok());
  for (LinkId l : *cable) c.scale_bandwidth(l, 0.25);
  CHECK(c.route_bandwidth(c.route(3, 11)) == Approx(before * 0.25));
  CHECK(c.route_bandwidth(c.route(11, 3)) == Approx(before * 0.25));
  CHECK(c.route_bandwidth(c.route(4, 12)) == Approx(before));  // another rail
}

TEST_CASE("traffic reroutes around failed cables on a shortest working path", "[simulator][faults]") {
  Cluster c = make("dgx-a100", 48 * 8);  // groups of 20 nodes: 3 leaf groups
  const int a = 2 * 8 + 5, b = 30 * 8 + 5;  // rail 5, nodes 2 and 30 (different groups)
  const Route direct = c.route(a, b);
  REQUIRE(direct.size == 8);

  SECTION("an uplink: another spine, same length") {
    // The spine this pair hashes to, from the direct route's 4th hop.
    const std::string up = c.link_name(direct.links[3]);
    fail_cable(c, up.substr(0, up.find(' ')));
    const Route r = c.route(a, b);
    check_walk(c, r, a, b);
    CHECK(r.size == 8);
    CHECK(r.links[3] != direct.links[3]);
  }
  SECTION("the source's NIC: out through its PCIe sibling's NIC (rail 4)") {
    fail_cable(c, "node2.nic5");
    const Route r = c.route(a, b);
    check_walk(c, r, a, b);
    CHECK(static_cast<int>(r.size) == bfs_hops(c, a, b));
    CHECK(c.link_name(r.links[2]) == "node2.nic4 (up)");
    // Traffic of other GPUs keeps its direct route.
    CHECK(c.route(a + 1, b + 1).size == 8);
  }
  SECTION("both NICs behind a PCIe switch: over NVLink through another GPU") {
    fail_cable(c, "node2.nic5");
    fail_cable(c, "node2.nic4");
    const Route r = c.route(a, b);
    check_walk(c, r, a, b);
    CHECK(static_cast<int>(r.size) == bfs_hops(c, a, b));
    CHECK(c.link_name(r.links[0]) == "node2.gpu5 (up)");
  }
  SECTION("an NVLink port inside a node: over the PCIe switch") {
    fail_cable(c, "node2.gpu5");
    const Route r = c.route(a, a - 1);  // GPU 5 -> GPU 4, PCIe siblings
    check_walk(c, r, a, a - 1);
    CHECK(r.size == 2);
    CHECK(c.link_name(r.links[0]) == "node2.pcie5 (up)");
    const Route far = c.route(a, a - 5);  // GPU 5 -> GPU 0: through a sibling's NVLink
    check_walk(c, far, a, a - 5);
    CHECK(static_cast<int>(far.size) == bfs_hops(c, a, a - 5));
  }
  SECTION("every pair of a sample stays on a shortest working path") {
    fail_cable(c, "node2.nic5");
    fail_cable(c, "leaf5-spine3");
    fail_cable(c, "node30.gpu1");
    for (int s : {a, 2 * 8 + 1, 30 * 8 + 1, 7})
      for (int d : {b, 30 * 8 + 2, 2 * 8 + 3, 45 * 8 + 5}) {
        if (s == d) continue;
        CAPTURE(s, d);
        const Route r = c.route(s, d);
        check_walk(c, r, s, d);
        CHECK(static_cast<int>(r.size) == bfs_hops(c, s, d));
      }
  }
}

TEST_CASE("with no working path the job stops, naming the pair and the cables", "[simulator][faults]") {
  Cluster c = make("dgx-h100", 8);  // one node: no network to go around
  fail_cable(c, "node0.gpu2");
  fail_cable(c, "node0.pcie2");
  const Route r = c.route(2, 6);
  CHECK(r.unreachable);
  CHECK(r.size == 0);
  const auto s = c.check_route(2, 6);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(),
             Catch::Contains("no working path from GPU 2 (node0.gpu2) to GPU 6 (node0.gpu6)") &&
                 Catch::Contains("node0.gpu2, node0.pcie2 down: the job stops"));
  CHECK(c.check_route(3, 6).ok());
}
