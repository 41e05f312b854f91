#include "simulator/network.h"

#include <catch2/catch.hpp>

using namespace meshtrain::sim;

namespace {

struct Arrivals : EventHandler {
  std::vector<std::pair<uint64_t, Time>> at;
  void on_event(Simulator& s, uint64_t tag) override { at.push_back({tag, s.now()}); }
  Time of(uint64_t tag) const {
    for (auto& [t, when] : at)
      if (t == tag) return when;
    return -1;
  }
};

Cluster one_node() {
  auto c = Cluster::build(*cluster_preset("dgx-h100"), 8);
  REQUIRE(c.ok());
  return std::move(c).value();
}

}  // namespace

TEST_CASE("one flow takes latency + bytes / bandwidth", "[simulator][network]") {
  Cluster c = one_node();
  Simulator sim;
  Network net(sim, c);
  Arrivals done;
  const double B = 450e9;              // NVLink4 per direction
  const Time hop = 250 * kNanosecond;  // GPU->NVSwitch and NVSwitch->GPU
  net.start_flow(0, 1, 450e6, &done, 7);
  sim.run();
  REQUIRE(done.at.size() == 1);
  // 450 MB at 450 GB/s is exactly 1 ms.
  CHECK(done.of(7) == from_seconds(450e6 / B) + 2 * hop);
  CHECK(done.of(7) == kMillisecond + 500 * kNanosecond);
  CHECK(net.active_flows() == 0);
}

TEST_CASE("two flows share a link, and the survivor speeds up when one ends",
          "[simulator][network]") {
  Cluster c = one_node();
  Simulator sim;
  Network net(sim, c);
  Arrivals done;
  const double S = 450e6;
  // Both leave GPU 0 (shared uplink into the NVSwitch) for different GPUs.
  FlowId a = net.start_flow(0, 1, S, &done, 1);
  FlowId b = net.start_flow(0, 2, 2 * S, &done, 2);
  sim.run_until(kMillisecond);
  CHECK(net.rate(a) == 225e9);
  CHECK(net.rate(b) == 225e9);
  // a: S at B/2 -> drains at 2S/B = 2 ms. b has moved S by then and the
  // remaining S goes at full B: drains at 3 ms.
  sim.run_until(2 * kMillisecond);
  CHECK(net.rate(b) == 450e9);
  sim.run();
  CHECK(done.of(1) == 2 * kMillisecond + 500 * kNanosecond);
  CHECK(done.of(2) == 3 * kMillisecond + 500 * kNanosecond);
}

TEST_CASE("max-min fairness gives unbottlenecked flows the leftover", "[simulator][network]") {
  // Flows x: 0->1, y: 0->2, z: 3->2. Links: up0 carries x,y; down2 carries y,z.
  // Every link has B, so all three get B/2 (y is bottlenecked on both).
  // Give z a competitor w: 4->2 on down2 as well: down2 has y,z,w -> B/3 each,
  // then x takes the leftover of up0: B - B/3.
  Cluster c = one_node();
  Simulator sim;
  Network net(sim, c);
  Arrivals done;
  const double B = 450e9;
  FlowId x = net.start_flow(0, 1, 1e9, &done, 1);
  FlowId y = net.start_flow(0, 2, 1e9, &done, 2);
  FlowId z = net.start_flow(3, 2, 1e9, &done, 3);
  FlowId w = net.start_flow(4, 2, 1e9, &done, 4);
  sim.run_until(1);
  CHECK(net.rate(y) == Approx(B / 3));
  CHECK(net.rate(z) == Approx(B / 3));
  CHECK(net.rate(w) == Approx(B / 3));
  CHECK(net.rate(x) == Approx(B - B / 3));
  // A flow elsewhere (5->6) is in another component: recomputing it touches
  // only itself.
  const uint64_t touched = net.flows_touched();
  net.start_flow(5, 6, 1e9, &done, 5);
  sim.run_until(2);
  CHECK(net.flows_touched() - touched == 1);
  sim.run();
  CHECK(done.at.size() == 5);
}

TEST_CASE("zero-byte and local flows complete", "[simulator][network]") {
  Cluster c = one_node();
  Simulator sim;
  Network net(sim, c);
  Arrivals done;
  net.start_flow(3, 3, 1e9, &done, 1);  // local: no link
  net.start_flow(0, 1, 0, &done, 2);    // empty: only latency
  sim.run();
  CHECK(done.of(1) == 0);
  CHECK(done.of(2) == 500 * kNanosecond);
}
