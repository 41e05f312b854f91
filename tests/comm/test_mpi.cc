// The MPI communicator under `mpirun -np 4`: every collective gives the same
// bits as the in-process communicator computes for the same inputs (each MPI
// rank also runs the four in-process ranks as threads), and a timeout names the
// rank that did not arrive.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include "backends/comm/launch.h"
#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "simulator/cluster_spec.h"
#include "simulator/collective.h"
#include "simulator/topology.h"
#include "tests/comm/reference.h"
#include "tests/mpi_catch_main.h"

using namespace meshtrain;
using meshtrain::testing::bit_difference;
using meshtrain::testing::contributions;

namespace {

constexpr int kWorld = 4;

// Overlapping groups of uneven sizes, visited in id order by every rank.
const std::vector<Group> kGroups{{0, {0, 1, 2, 3}}, {1, {1, 3}}, {2, {0, 2}}, {3, {0, 1, 2}}};

using Outputs = std::map<std::string, std::vector<float>>;

std::int64_t a2a_count(int from, int to) { return (from + 2 * to + 1) % 4; }

// The same calls on either communicator; results keyed by collective and group.
Status run_suite(Communicator& c, Outputs& out) {
  const int r = c.rank();
  for (const Group& g : kGroups) {
    if (g.index_of(r) < 0) continue;
    const auto G = static_cast<std::size_t>(g.size());
    for (std::size_t n : {std::size_t{2}, std::size_t{5003}}) {
      const std::string key = fmt::format("g{} n{} ", g.id, n);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const char* name = op == ReduceOp::sum ? "sum" : "max";
        auto& ar = out[key + "all_reduce " + name] = contributions(r, n);
        MT_TRY(c.all_reduce(ar, g, op));
        const auto in = contributions(r, n * G, 1);
        auto& rs = out[key + "reduce_scatter " + name];
        rs.resize(n);
        MT_TRY(c.reduce_scatter(in, rs, g, op));
      }
      auto& ag = out[key + "all_gather"];
      ag.resize(n * G);
      MT_TRY(c.all_gather(contributions(r, n, 2), ag, g));
      auto& bc = out[key + "broadcast"] = contributions(r, n, 3);
      MT_TRY(c.broadcast(bc, g, g.ranks.back()));
    }
    std::vector<std::int64_t> sc, rc;
    for (int peer : g.ranks) {
      sc.push_back(a2a_count(r, peer));
      rc.push_back(a2a_count(peer, r));
    }
    const auto send = contributions(r, static_cast<std::size_t>(std::accumulate(sc.begin(), sc.end(), 0ll)), 4);
    auto& a2a = out[fmt::format("g{} all_to_all", g.id)];
    a2a.resize(static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), 0ll)));
    MT_TRY(c.all_to_all(send, sc, a2a, rc, g));
    MT_TRY(c.barrier(g));
  }
  // A ring in both directions, with two tags received in the opposite order.
  const int right = (r + 1) % kWorld, left = (r + kWorld - 1) % kWorld;
  MT_TRY(c.send(contributions(r, 7, 5), right, 1));
  MT_TRY(c.send(contributions(r, 3, 6), right, 2));
  auto& second = out["recv tag 2"];
  second.resize(3);
  MT_TRY(c.recv(second, left, 2));
  auto& first = out["recv tag 1"];
  first.resize(7);
  MT_TRY(c.recv(first, left, 1));
  // Both communicators count what this rank sent the same way (communicator.h).
  out["bytes sent"] = {static_cast<float>(c.bytes_sent())};
  return ok_status();
}

}  // namespace

TEST_CASE("mpirun's variables are detected", "[comm][mpi]") {
  auto launch = detect_launch();
  REQUIRE(launch.ok());
  REQUIRE(launch->has_value());
  CHECK((*launch)->launcher == "mpirun");
  int rank = -1, world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CHECK((*launch)->rank == rank);
  CHECK((*launch)->world_size == world);
}

TEST_CASE("MPI collectives equal the in-process ones bit for bit", "[comm][mpi]") {
  auto mpi = MpiCommunicator::create();
  REQUIRE(mpi.ok());
  REQUIRE((*mpi)->world_size() == kWorld);
  std::vector<Outputs> reference(kWorld);
  Status threads = run_ranks(kWorld, [&](int r, Communicator& c) {
    return run_suite(c, reference[static_cast<std::size_t>(r)]);
  });
  REQUIRE(threads.ok());
  Outputs mine;
  Status st = run_suite(**mpi, mine);
  INFO((st.ok() ? std::string() : st.error().message()));
  REQUIRE(st.ok());
  const auto& expect = reference[static_cast<std::size_t>((*mpi)->rank())];
  REQUIRE(mine.size() == expect.size());
  for (const auto& [key, values] : expect) {
    CAPTURE(key);
    CHECK(bit_difference(mine[key], values) == "");
  }
}

TEST_CASE("an MPI rank that does not arrive is named by the others' timeout", "[comm][mpi]") {
  CommOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  auto made = MpiCommunicator::create(opt);
  REQUIRE(made.ok());
  auto& c = **made;
  const Group world{0, {0, 1, 2, 3}};
  REQUIRE(c.barrier(world).ok());  // the group's communicator exists on every rank
  if (c.rank() == 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
  } else {
    std::vector<float> x(4, 1.f);
    const auto start = std::chrono::steady_clock::now();
    Status st = c.all_reduce(x, world, ReduceOp::sum);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start).count();
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.error().message(),
               Catch::Contains(fmt::format("rank {}: all_reduce on group 0 (ranks [0, 1, 2, 3]): timed out after 300 ms; still waiting for rank 3", c.rank())));
    // Not before the timeout; the message says which wait ran out, and the
    // upper bound, loose because 4 processes share a loaded machine, that
    // nothing waited for rank 3 for good.
    CHECK(ms >= 290);
    CHECK(ms < 10000);
    Status later = c.barrier(world);
    REQUIRE_FALSE(later.ok());
    CHECK_THAT(later.error().message(), Catch::Contains("poisoned") && Catch::Contains("still waiting for rank 3"));
  }
  // Resynchronise outside the poisoned communicator so the job ends cleanly.
  MPI_Barrier(MPI_COMM_WORLD);
}

namespace {

// Off-node floats sent by each collective at one size.
struct OffNode {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
};

// Every rank's counts added up (collective over MPI_COMM_WORLD).
OffNode world_sum(OffNode mine) {
  OffNode total;
  MPI_Allreduce(&mine, &total, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

double floats_since(const MpiCommunicator& c, std::int64_t before) {
  return static_cast<double>(c.bytes_sent_off_node() - before) / sizeof(float);
}

// Runs an all-reduce (n), a reduce-scatter (n per member) and an all-gather
// (n per member) over g, checks each against the fold in group order
// (testing::fold) bit for bit, and returns the off-node floats this rank sent.
OffNode run_checked(MpiCommunicator& c, const Group& g, std::size_t n, ReduceOp op) {
  const int r = c.rank();
  const auto G = static_cast<std::size_t>(g.size());
  std::vector<std::vector<float>> ar_in(kWorld), rs_in(kWorld), ag_in(kWorld);
  for (int p : g.ranks) {
    ar_in[static_cast<std::size_t>(p)] = contributions(p, n, 7);
    rs_in[static_cast<std::size_t>(p)] = contributions(p, n * G, 8);
  }
  OffNode off;
  std::int64_t before = c.bytes_sent_off_node();
  auto ar = ar_in[static_cast<std::size_t>(r)];
  REQUIRE(c.all_reduce(ar, g, op).ok());
  CHECK(bit_difference(ar, testing::fold(ar_in, g.ranks, op)) == "");
  off.all_reduce = floats_since(c, before);

  before = c.bytes_sent_off_node();
  std::vector<float> rs(n);
  REQUIRE(c.reduce_scatter(rs_in[static_cast<std::size_t>(r)], rs, g, op).ok());
  const auto k = static_cast<std::size_t>(g.index_of(r));
  const auto full = testing::fold(rs_in, g.ranks, op);
  CHECK(bit_difference(rs, std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(k * n),
                                              full.begin() + static_cast<std::ptrdiff_t>((k + 1) * n))) == "");
  off.reduce_scatter = floats_since(c, before);

  before = c.bytes_sent_off_node();
  std::vector<float> ag(n * G), expect;
  REQUIRE(c.all_gather(contributions(r, n, 9), ag, g).ok());
  for (int p : g.ranks) {
    const auto block = contributions(p, n, 9);
    expect.insert(expect.end(), block.begin(), block.end());
  }
  CHECK(bit_difference(ag, expect) == "");
  off.all_gather = floats_since(c, before);
  return off;
}

// Bytes a simulator plan sends between nodes, flow by flow.
double plan_off_node_bytes(const sim::Cluster& cluster, const sim::CollectivePlan& plan) {
  double total = 0;
  for (const auto& step : plan.steps)
    sim::for_each_flow(plan, step, [&](int src, int dst) {
      if (cluster.node_of(src) != cluster.node_of(dst)) total += step.bytes * step.repeats;
    });
  return total;
}

}  // namespace

TEST_CASE("hierarchical collectives across 2 nodes x 2 ranks match the fold in group order bit for bit",
          "[comm][mpi][hierarchical]") {
  // Nodes {0,0,1,1}: the world group is 2 nodes of 2 contiguous members
  // (hierarchical from 64 KiB); {0,1,0,1} interleaves them (always flat).
  auto hier = MpiCommunicator::create(CommOptions{std::chrono::minutes(1)}, {0, 0, 1, 1});
  auto interleaved = MpiCommunicator::create(CommOptions{std::chrono::minutes(1)}, {0, 1, 0, 1});
  REQUIRE(hier.ok());
  REQUIRE(interleaved.ok());
  const Group world{0, {0, 1, 2, 3}};
  // 200,000 floats: lanes of 100,000, two chain segments; 1,000: below the threshold.
  for (const std::size_t n : {std::size_t{1000}, std::size_t{200000}}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      CAPTURE(n, op == ReduceOp::sum ? "sum" : "max");
      const OffNode h = world_sum(run_checked(**hier, world, n, op));
      const OffNode flat = world_sum(run_checked(**interleaved, world, n, op));
      const double N = 2, L = 2, G = 4;
      // Interleaved nodes: flat, every member has G - L = 2 peers off its node.
      CHECK(flat.all_reduce == 2 * (G - L) * static_cast<double>(n));
      CHECK(flat.reduce_scatter == G * (G - L) * static_cast<double>(n));
      CHECK(flat.all_gather == G * (G - L) * static_cast<double>(n));
      if (n < 16384) {  // under 64 KiB: flat too, and {0,0,1,1} puts the same 2 peers off node
        CHECK(h.all_reduce == flat.all_reduce);
        CHECK(h.reduce_scatter == flat.reduce_scatter);
        CHECK(h.all_gather == flat.all_gather);
      } else {
        CHECK(h.all_reduce == 2 * (N - 1) * static_cast<double>(n));               // 1/L of flat
        CHECK(h.reduce_scatter == L * (N - 1) * (N + 1) * static_cast<double>(n));  // (N+1)/(N·L)
        CHECK(h.all_gather == G * (N - 1) * static_cast<double>(n));                // 1/L
      }
    }
  }
  // Groups that are not N nodes of L >= 2 contiguous members stay flat and exact.
  for (const Group& g : {Group{1, {1, 2}}, Group{2, {0, 1, 2}}, Group{3, {0, 1}}}) {
    if (g.index_of((*hier)->rank()) < 0) continue;
    CAPTURE(g.id);
    run_checked(**hier, g, 200000, ReduceOp::sum);
  }
}

TEST_CASE("the simulator picks the MPI communicator's algorithm and moves the same bytes across nodes",
          "[comm][mpi][hierarchical][sim]") {
  // A host cluster of 2 nodes x 2 ranks; the MPI communicator sees the same nodes.
  auto spec = sim::cluster_spec_from_json(R"({"base": "local-cpu", "gpus_per_node": 2})");
  REQUIRE(spec.ok());
  auto cluster = sim::Cluster::build(*spec, kWorld);
  REQUIRE(cluster.ok());
  const sim::CostConstants constants;
  auto mpi = MpiCommunicator::create(CommOptions{std::chrono::minutes(1)}, {0, 0, 1, 1});
  REQUIRE(mpi.ok());
  const Group world{0, {0, 1, 2, 3}};
  for (const std::size_t n : {std::size_t{100}, std::size_t{4000}, std::size_t{4096}, std::size_t{200000}}) {
    CAPTURE(n);
    const OffNode measured = world_sum(run_checked(**mpi, world, n, ReduceOp::sum));
    // nccl-tests sizes: the all-reduce buffer, the reduce-scatter input, the all-gather output.
    const double bytes = static_cast<double>(n * sizeof(float));
    const std::pair<sim::CollectiveKind, double> cases[] = {
        {sim::CollectiveKind::kAllReduce, bytes},
        {sim::CollectiveKind::kReduceScatter, kWorld * bytes},
        {sim::CollectiveKind::kAllGather, kWorld * bytes}};
    for (const auto& [kind, size] : cases) {
      CAPTURE(sim::collective_kind_name(kind));
      auto plan = sim::plan_collective(*cluster, constants, {kind, {0, 1, 2, 3}, size});
      REQUIRE(plan.ok());
      const double moved = kind == sim::CollectiveKind::kAllReduce       ? measured.all_reduce
                           : kind == sim::CollectiveKind::kReduceScatter ? measured.reduce_scatter
                                                                          : measured.all_gather;
      // The communicator went hierarchical exactly when it sent less than the flat exchange's 2 of 4 peers.
      const double flat = (kind == sim::CollectiveKind::kAllReduce ? 4.0 : 8.0) * static_cast<double>(n);
      CHECK(plan->algorithm == (moved < flat ? sim::Algorithm::kHierarchical : sim::Algorithm::kDirect));
      CHECK(plan_off_node_bytes(*cluster, *plan) == moved * sizeof(float));
    }
  }
}

int main(int argc, char** argv) { return meshtrain::testing::run_catch_under_mpi(argc, argv); }
