#include "simulator/collective.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <numeric>

#include "tests/simulator/executor_fixture.h"

using namespace meshtrain::sim;

namespace {

using testing::make;

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

CollectiveResult sim(const Cluster& c, CollectiveKind kind, std::vector<int> members, double bytes,
                     Algorithm a, CollectiveMode mode = CollectiveMode::kFlows) {
  CostConstants k;
  CollectiveRequest req{kind, std::move(members), bytes, a, 0};
  auto r = simulate_collective(c, k, req, mode);
  REQUIRE(r.ok());
  return *r;
}

const double kGiB = 1024.0 * 1024 * 1024;

}  // namespace

TEST_CASE("busbw factors are nccl-tests'", "[simulator][collective]") {
  CHECK(busbw_factor(CollectiveKind::kAllReduce, 8) == 2.0 * 7 / 8);
  CHECK(busbw_factor(CollectiveKind::kReduceScatter, 8) == 7.0 / 8);
  CHECK(busbw_factor(CollectiveKind::kAllGather, 4) == 3.0 / 4);
  CHECK(busbw_factor(CollectiveKind::kAllToAll, 16) == 15.0 / 16);
  CHECK(busbw_factor(CollectiveKind::kBroadcast, 8) == 1.0);
  CHECK(busbw_factor(CollectiveKind::kSendRecv, 2) == 1.0);
}

TEST_CASE("ring all-reduce on one switch: 2(n-1)/n S/B + 2(n-1) alpha", "[simulator][collective]") {
  Cluster c = make("dgx-h100", 8);
  const CostConstants k;
  const double B = 450e9, S = kGiB;
  for (int n : {2, 4, 8}) {
    CollectiveResult r = sim(c, CollectiveKind::kAllReduce, iota(n), S, Algorithm::kRing);
    const double want = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * to_seconds(k.collective_alpha);
    CHECK(to_seconds(r.duration) == Approx(want).epsilon(0.01));
    // nccl-tests: algbw = S / t, busbw = algbw · 2(n-1)/n, which for a ring
    // approaches the link bandwidth.
    CHECK(r.algbw == Approx(S / to_seconds(r.duration)));
    CHECK(r.busbw == Approx(r.algbw * 2.0 * (n - 1) / n));
    CHECK(r.busbw == Approx(B).epsilon(0.02));
  }
}

TEST_CASE("analytic mode agrees with flows when nothing contends", "[simulator][collective]") {
  Cluster c = make("dgx-a100", 32);
  for (auto [kind, a] : {std::pair{CollectiveKind::kAllReduce, Algorithm::kRing},
                         std::pair{CollectiveKind::kAllReduce, Algorithm::kHierarchical},
                         std::pair{CollectiveKind::kAllGather, Algorithm::kRing},
                         std::pair{CollectiveKind::kAllToAll, Algorithm::kPairwise}}) {
    const Time f = sim(c, kind, iota(32), 256e6, a).duration;
    const Time an = sim(c, kind, iota(32), 256e6, a, CollectiveMode::kAnalytic).duration;
    INFO(collective_kind_name(kind) << " " << algorithm_name(a));
    CHECK(to_seconds(an) == Approx(to_seconds(f)).epsilon(0.02));
  }
}

TEST_CASE("hierarchical all-reduce matches its three-phase formula", "[simulator][collective]") {
  Cluster c = make("dgx-h100", 16);
  const CostConstants k;
  const double S = kGiB, Bnv = 450e9, Bnic = 50e9;
  const int L = 8, N = 2;
  const double alpha = to_seconds(k.collective_alpha), net_alpha = to_seconds(k.collective_net_alpha);
  const double lat_nv = 500e-9;   // 2 NVLink hops
  const double lat_net = 2.2e-6;  // PCIe, PCIe, NIC, NIC, PCIe, PCIe: 250+250+600+600+250+250 ns
  const double intra = (L - 1) * (alpha + lat_nv + S / L / Bnv);
  const double inter = 2 * (N - 1) * (net_alpha + lat_net + S / L / N / Bnic);
  CollectiveResult r = sim(c, CollectiveKind::kAllReduce, iota(16), S, Algorithm::kHierarchical);
  CHECK(to_seconds(r.duration) == Approx(2 * intra + inter).epsilon(0.01));
  // A flat ring crosses the NICs with S/n per step on 2(n-1) steps, so it
  // is slower than the hierarchy, whose network phase moves S/L per rail.
  CHECK(sim(c, CollectiveKind::kAllReduce, iota(16), S, Algorithm::kRing).duration > r.duration);
  // Hierarchical needs the same GPUs on every node.
  CostConstants kk;
  auto bad = plan_collective(
      c, kk, {CollectiveKind::kAllReduce, {0, 1, 2, 8}, S, Algorithm::kHierarchical, 0});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("same number of members"));
}

// NCCL's ring on a rail-optimized cluster (collective.h, "hierarchical"): the
// node's sum first over NVLink, then one ring per rail across the nodes, so
// that each NIC carries 1/L of the data; all-gather the reverse. Worked from
// the link rates (dgx-h100: 450 GB/s NVLink, 400 Gb/s NIC per GPU) and the
// two step costs, α inside a node and NCCL's network α across.
TEST_CASE("reduce-scatter and all-gather across nodes: rail rings, worked by hand", "[simulator][collective]") {
  Cluster c = make("dgx-h100", 32);
  const CostConstants k;
  const double S = kGiB, Bnv = 450e9, Bnic = 50e9;
  const double alpha = to_seconds(k.collective_alpha), net_alpha = to_seconds(k.collective_net_alpha);
  const double lat_nv = 500e-9, lat_net = 2.2e-6;
  const int L = 8, N = 4, n = L * N;
  const double in_node = (L - 1) * (alpha + lat_nv + S / L / Bnv);
  const double across = (N - 1) * (net_alpha + lat_net + S / (L * N) / Bnic);
  for (CollectiveKind kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    INFO(collective_kind_name(kind));
    const CollectiveResult h = sim(c, kind, iota(n), S, Algorithm::kHierarchical);
    CHECK(to_seconds(h.duration) == Approx(in_node + across).epsilon(0.005));
    // The flat ring in rank order: every step has one crossing per node on
    // one NIC, S/n each, and pays the network α: n-1 such steps at least
    // (its crossings change rail, GPU 7 to GPU 8, so they also share spine
    // uplinks, which makes it slower still).
    const CollectiveResult flat = sim(c, kind, iota(n), S, Algorithm::kRing);
    CHECK(to_seconds(flat.duration) >= (n - 1) * (net_alpha + lat_net + S / n / Bnic));
    // NCCL's choice is the faster, the rail rings (about L times the bus bandwidth).
    CHECK(sim(c, kind, iota(n), S, Algorithm::kAuto).algorithm == Algorithm::kHierarchical);
    CHECK(to_seconds(flat.duration) / to_seconds(h.duration) > 6.0);
  }
  // One member per node (a data-parallel group under tp 8): one ring on one
  // rail, N-1 network steps of S/N.
  const std::vector<int> rail = {3, 11, 19, 27};
  const CollectiveResult one = sim(c, CollectiveKind::kReduceScatter, rail, S, Algorithm::kAuto);
  CHECK(to_seconds(one.duration) == Approx(3 * (net_alpha + lat_net + S / 4 / Bnic)).epsilon(0.005));
  // Analytic mode times the same steps.
  CHECK(to_seconds(sim(c, CollectiveKind::kAllGather, iota(n), S, Algorithm::kAuto, CollectiveMode::kAnalytic)
                       .duration) == Approx(in_node + across).epsilon(0.005));
}

TEST_CASE("double binary tree: structure, log latency, and the auto choice",
          "[simulator][collective]") {
  Cluster c = make("dgx-a100", 64);
  const CostConstants k;
  for (int n : {2, 5, 8, 13, 64}) {
    auto plan =
        plan_collective(c, k, {CollectiveKind::kAllReduce, iota(n), 1e6, Algorithm::kTree, 0});
    REQUIRE(plan.ok());
    const auto& pairs = plan->orders[0];
    // Two trees, each n-1 edges, each edge up and down: 4(n-1) flows.
    REQUIRE(pairs.size() == 8u * (n - 1));
    // Every member has a parent in each tree except the two roots.
    std::vector<int> ups(n, 0);
    for (size_t i = 0; i < pairs.size(); i += 4) ++ups[pairs[i]];
    int roots = 0;
    for (int u : ups) {
      CHECK(u <= 2);
      roots += 2 - u;
    }
    CHECK(roots == 2);
  }
  // A tiny message is latency bound: 2h + C - 1 steps with C = 1 and
  // h = ceil(log2 64) = 6 is 12 steps, against 126 for the ring.
  const double tiny = 8192;
  const Time tree = sim(c, CollectiveKind::kAllReduce, iota(64), tiny, Algorithm::kTree).duration;
  const Time ring = sim(c, CollectiveKind::kAllReduce, iota(64), tiny, Algorithm::kRing).duration;
  CHECK(tree < ring);
  // Every tree step crosses nodes (8 per node): each costs the network α.
  CHECK(to_seconds(tree) >= 12 * to_seconds(k.collective_net_alpha));
  CHECK(to_seconds(tree) <= 12 * (to_seconds(k.collective_net_alpha) + 10e-6));
  CHECK(sim(c, CollectiveKind::kAllReduce, iota(64), tiny, Algorithm::kAuto).algorithm ==
        Algorithm::kTree);
  // A large message is bandwidth bound, where tree loses.
  const CollectiveResult big = sim(c, CollectiveKind::kAllReduce, iota(64), kGiB, Algorithm::kAuto,
                                   CollectiveMode::kAnalytic);
  CHECK(big.algorithm != Algorithm::kTree);
  CHECK(big.duration < sim(c, CollectiveKind::kAllReduce, iota(64), kGiB, Algorithm::kTree,
                           CollectiveMode::kAnalytic)
                           .duration);
}

TEST_CASE("pairwise all-to-all, ring reduce-scatter, broadcast and send/recv",
          "[simulator][collective]") {
  Cluster c = make("dgx-h100", 8);
  const CostConstants k;
  const double B = 450e9, S = kGiB, alpha = to_seconds(k.collective_alpha), lat = 500e-9;
  const int n = 8;
  // all-to-all: one step, each member sends S/n to every peer at once, so its
  // NVLink port carries n-1 of them.
  CollectiveResult a2a = sim(c, CollectiveKind::kAllToAll, iota(n), S, Algorithm::kAuto);
  CHECK(a2a.algorithm == Algorithm::kPairwise);
  CHECK(to_seconds(a2a.duration) == Approx(alpha + lat + (n - 1) * S / n / B).epsilon(0.001));
  CHECK(a2a.busbw == Approx(a2a.algbw * (n - 1) / n));
  // reduce-scatter: n-1 ring steps of S/n.
  CollectiveResult rs = sim(c, CollectiveKind::kReduceScatter, iota(n), S, Algorithm::kRing);
  CHECK(to_seconds(rs.duration) == Approx((n - 1) * (alpha + lat + S / n / B)).epsilon(0.001));
  // broadcast: a chain, C = 64 chunks of S/64, n + C - 2 steps.
  CollectiveResult bc = sim(c, CollectiveKind::kBroadcast, iota(n), S, Algorithm::kRing);
  CHECK(to_seconds(bc.duration) ==
        Approx((n + 64 - 2) * (alpha + lat + S / 64 / B)).epsilon(0.001));
  CHECK(bc.busbw == Approx(bc.algbw));
  // send/recv: one flow.
  CollectiveResult sr = sim(c, CollectiveKind::kSendRecv, {2, 5}, S, Algorithm::kAuto);
  CHECK(to_seconds(sr.duration) == Approx(alpha + lat + S / B).epsilon(1e-6));
  CHECK(sr.busbw == Approx(sr.algbw));
}

TEST_CASE("all-to-all across nodes: every peer at once, bound by the NIC as nccl-tests finds",
          "[simulator][collective]") {
  // NCCL runs an all-to-all as one group of sends and receives to every
  // peer, so each member's network share leaves through its own NIC at once:
  // of S, (n - L)/n crosses nodes, and nccl-tests' busbw, algbw · (n-1)/n,
  // comes to (n-1)/(n-L) NIC rates, "N/(N-1) x the bandwidth per GPU" on N
  // nodes (NVIDIA/nccl-tests#130), not one NIC rate or less as n-1
  // serialised pairwise steps would give. PXN's forwarding over NVLink
  // (N·S/n to each of L-1 peers) runs under the rail transfers.
  Cluster c = make("dgx-h100", 64);
  const CostConstants k;
  const double S = kGiB, Bnic = 50e9, Bnv = 450e9;
  const double net_alpha = to_seconds(k.collective_net_alpha), lat_net = 2.2e-6;
  const int L = 8;
  for (int N : {2, 4, 8}) {
    const int n = L * N;
    INFO(N << " nodes");
    const CollectiveResult r = sim(c, CollectiveKind::kAllToAll, iota(n), S, Algorithm::kAuto);
    CHECK(r.algorithm == Algorithm::kPairwise);
    // The NIC is the bound: what crosses NVLink, forwarded blocks included, takes less.
    const double network = S * (n - L) / n / Bnic;
    REQUIRE(network > (L - 1) * N * S / n / Bnv);
    CHECK(to_seconds(r.duration) == Approx(net_alpha + lat_net + network).epsilon(0.005));
    CHECK(r.busbw == Approx(Bnic * (n - 1) / (n - L)).epsilon(0.005));
    CHECK(r.busbw == Approx(Bnic * N / (N - 1)).epsilon(0.07));
  }
  // A member per node (an expert group strided over the nodes): all of it
  // crosses, busbw one NIC rate.
  const CollectiveResult strided = sim(c, CollectiveKind::kAllToAll, {0, 8, 16, 24}, S, Algorithm::kAuto);
  CHECK(to_seconds(strided.duration) == Approx(net_alpha + lat_net + S * 3 / 4 / Bnic).epsilon(0.005));
  // With PXN no flow changes rail, so flows on the network time what the
  // analytic model does, and the flows stay few: L·(L-1)·N in the nodes and
  // N·(N-1)·L on the rails, not n·(n-1).
  const std::vector<int> four_nodes = iota(32);
  CHECK(sim(c, CollectiveKind::kAllToAll, four_nodes, S, Algorithm::kAuto, CollectiveMode::kAnalytic).duration ==
        sim(c, CollectiveKind::kAllToAll, four_nodes, S, Algorithm::kAuto).duration);
  auto plan = plan_collective(c, k, {CollectiveKind::kAllToAll, four_nodes, S});
  REQUIRE(plan.ok());
  CHECK(flow_pairs(*plan).size() == 8 * 7 * 4 + 4 * 3 * 8);
  // The cpu backend's MPI all-to-all forwards nothing: on a cluster of CPU
  // devices, 2 nodes of 2, every rank sends S/n straight to each of the others.
  auto host_spec = cluster_spec_from_json(R"({"base": "local-cpu", "gpus_per_node": 2})");
  REQUIRE(host_spec.ok());
  auto host = Cluster::build(*host_spec, 4);
  REQUIRE(host.ok());
  auto direct = plan_collective(*host, k, {CollectiveKind::kAllToAll, iota(4), S});
  REQUIRE(direct.ok());
  REQUIRE(direct->steps.size() == 1);
  CHECK(direct->steps[0].bytes == S / 4);
  CHECK(flow_pairs(*direct).size() == 4 * 3);
}

TEST_CASE("bad collective requests are errors", "[simulator][collective]") {
  Cluster c = make("dgx-h100", 8);
  const CostConstants k;
  auto msg = [&](CollectiveRequest r) {
    auto p = plan_collective(c, k, r);
    REQUIRE_FALSE(p.ok());
    return p.error().message();
  };
  CHECK_THAT(msg({CollectiveKind::kAllReduce, {0, 9}, 1, Algorithm::kRing, 0}),
             Catch::Contains("GPU 9"));
  CHECK_THAT(msg({CollectiveKind::kAllReduce, {0, 0}, 1, Algorithm::kRing, 0}),
             Catch::Contains("twice"));
  CHECK_THAT(msg({CollectiveKind::kAllToAll, {0, 1}, 1, Algorithm::kRing, 0}),
             Catch::Contains("does not apply"));
  CHECK_THAT(msg({CollectiveKind::kSendRecv, {0, 1, 2}, 1, Algorithm::kAuto, 0}),
             Catch::Contains("exactly 2"));
  CHECK_THAT(msg({CollectiveKind::kAllReduce, {0, 1}, -1, Algorithm::kAuto, 0}),
             Catch::Contains("bytes"));
  CHECK_FALSE(parse_algorithm("rings").ok());
  CHECK(*parse_algorithm("hierarchical") == Algorithm::kHierarchical);
}

TEST_CASE("1024-member ring all-reduce at scale", "[simulator][collective][scale]") {
  Cluster c = make("dgx-a100", 1024);
  // NCCL keeps a ring's node-to-node hops on one rail: nodes alternate
  // GPU order 0..7 and 7..0, so every inter-node hop uses rail 0 or rail 7.
  std::vector<int> snake;
  for (int node = 0; node < 128; ++node)
    for (int i = 0; i < 8; ++i) snake.push_back(node * 8 + (node % 2 == 0 ? i : 7 - i));
  auto t0 = std::chrono::steady_clock::now();
  CollectiveResult an =
      sim(c, CollectiveKind::kAllReduce, snake, kGiB, Algorithm::kRing, CollectiveMode::kAnalytic);
  auto t1 = std::chrono::steady_clock::now();
  CollectiveResult fl = sim(c, CollectiveKind::kAllReduce, snake, kGiB, Algorithm::kRing);
  auto t2 = std::chrono::steady_clock::now();
  using S = std::chrono::duration<double>;
  WARN("1024-GPU rail-aligned ring all-reduce of 1 GiB: simulated "
       << to_seconds(fl.duration) * 1e3 << " ms, busbw " << fl.busbw / 1e9
       << " GB/s; wall: analytic " << S(t1 - t0).count() * 1e3 << " ms, flows "
       << S(t2 - t1).count() * 1e3 << " ms (2046 steps x 1024 flows)");
  CHECK(to_seconds(an.duration) == Approx(to_seconds(fl.duration)).epsilon(0.02));
  // The NIC (25 GB/s) is the bottleneck; every step has a flow that leaves
  // its node, so each of the 2046 pays the network α and ~2.2 µs of hops.
  CHECK(fl.busbw < 25e9);
  const double want = 2046 * (to_seconds(CostConstants{}.collective_net_alpha) + 2.2e-6) +
                      2.0 * 1023 / 1024 * kGiB / 25e9;
  CHECK(to_seconds(fl.duration) == Approx(want).epsilon(0.03));
  // In GPU-id order every node boundary goes rail 7 -> rail 0 through the
  // spines, where ECMP hashing collides flows on uplinks: slower.
  CollectiveResult naive = sim(c, CollectiveKind::kAllReduce, iota(1024), kGiB, Algorithm::kRing,
                               CollectiveMode::kAnalytic);
  CHECK(naive.duration > an.duration);
}

TEST_CASE("step costs route each flow pattern once, whatever the sizes", "[simulator][collective][scale]") {
  // A training step times the same groups at many sizes. With StepCosts the
  // routing of a pattern (here 4096 members over 512 nodes) is done once:
  // the ring's one pattern, the trees' one, the hierarchical all-reduce's
  // two (intra-node rings, per-rail rings); and each time equals the
  // uncached one (the step cost is linear in its bytes).
  const Cluster c = make("dgx-a100", 4096);
  const CostConstants k;
  StepCosts costs;
  for (int i = 0; i < 40; ++i) {
    const double bytes = 1024.0 * (1 << (i % 20)) * (1 + i / 20);
    const CollectiveRequest req{CollectiveKind::kAllReduce, iota(4096), bytes, Algorithm::kAuto, 0};
    auto cached = plan_collective(c, k, req, &costs);
    auto plain = plan_collective(c, k, req);
    REQUIRE(cached.ok());
    REQUIRE(plain.ok());
    CHECK(cached->algorithm == plain->algorithm);
    const double t = static_cast<double>(analytic_time(c, k, *cached, &costs));
    CHECK(t == Approx(static_cast<double>(analytic_time(c, k, *plain))).epsilon(1e-12));
  }
  CHECK(costs.patterns() == 4);
  // Another group is another pattern; the same members in another order too (another ring).
  std::vector<int> reversed = iota(4096);
  std::reverse(reversed.begin(), reversed.end());
  auto other = plan_collective(c, k, {CollectiveKind::kReduceScatter, reversed, 1e6, Algorithm::kRing, 0}, &costs);
  REQUIRE(other.ok());
  analytic_time(c, k, *other, &costs);
  CHECK(costs.patterns() == 5);
}

TEST_CASE("NVLS all-reduce: each GPU's buffer up to the switch and the sum back, S/(e·B) + one alpha",
          "[simulator][collective][nvls]") {
  Cluster c = make("dgx-h100", 8);
  const CostConstants k;
  const double B = 450e9, S = kGiB;
  // One pass: S leaves and S enters every GPU, at the switch's share e of the link.
  const CollectiveResult nvls = sim(c, CollectiveKind::kAllReduce, iota(8), S, Algorithm::kNvls);
  CHECK(to_seconds(nvls.duration) == Approx(S / (k.nvls_efficiency * B) + to_seconds(k.nvls_alpha)).epsilon(0.01));
  // nccl-tests' busbw of it, 2(n-1)/n · S/t, exceeds the link: 1.75 · 0.79 · 450 ≈ 622 GB/s at line rate
  // (about 480 measured, at NCCL's 0.77 of line rate: NVIDIA/nccl-tests#212).
  CHECK(nvls.busbw == Approx(1.75 * k.nvls_efficiency * B).epsilon(0.01));
  // NCCL's tuner picks it over the ring for a node's large all-reduce: the ring takes 2·7/8 · 0.79 = 1.38x as long.
  const CollectiveResult ring = sim(c, CollectiveKind::kAllReduce, iota(8), S, Algorithm::kRing);
  CHECK(to_seconds(ring.duration) / to_seconds(nvls.duration) == Approx(1.75 * k.nvls_efficiency).epsilon(0.02));
  const CollectiveResult chosen = sim(c, CollectiveKind::kAllReduce, iota(8), S, Algorithm::kAuto);
  CHECK(chosen.algorithm == Algorithm::kNvls);
  CHECK(parse_algorithm("nvls").value() == Algorithm::kNvls);
  // A small one stays a ring or tree: NVLS's 23 µs against 14 ring steps of 2 µs for 64 KiB.
  CHECK(sim(c, CollectiveKind::kAllReduce, iota(8), 64 * 1024, Algorithm::kAuto).algorithm != Algorithm::kNvls);
  // Four GPUs of a node that is part of a larger cluster: still one node, still NVLS.
  Cluster two_nodes = make("dgx-h100", 16);
  CHECK(sim(two_nodes, CollectiveKind::kAllReduce, {8, 9, 10, 11}, S, Algorithm::kAuto).algorithm == Algorithm::kNvls);
}

TEST_CASE("NVLS needs an NVSwitch that reduces and a group inside one node", "[simulator][collective][nvls]") {
  const CostConstants k;
  // A100's NVSwitch does not reduce: asked for, NVLS is refused; left to the tuner, a ring runs.
  Cluster a100 = make("dgx-a100", 8);
  auto refused = plan_collective(a100, k, CollectiveRequest{CollectiveKind::kAllReduce, iota(8), kGiB, Algorithm::kNvls, 0});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message(), Catch::Contains("NVLink SHARP"));
  CHECK(sim(a100, CollectiveKind::kAllReduce, iota(8), kGiB, Algorithm::kAuto).algorithm != Algorithm::kNvls);
  // Two H100 nodes: NVLS alone does not span them.
  Cluster h100 = make("dgx-h100", 16);
  auto across = plan_collective(h100, k, CollectiveRequest{CollectiveKind::kAllReduce, iota(16), kGiB, Algorithm::kNvls, 0});
  REQUIRE_FALSE(across.ok());
  CHECK_THAT(across.error().message(), Catch::Contains("one node"));
  CHECK(sim(h100, CollectiveKind::kAllReduce, iota(16), kGiB, Algorithm::kAuto).algorithm != Algorithm::kNvls);
  // Reductions other than all-reduce do not take it.
  CHECK_FALSE(plan_collective(h100, k, CollectiveRequest{CollectiveKind::kReduceScatter, iota(8), kGiB, Algorithm::kNvls, 0}).ok());
}
