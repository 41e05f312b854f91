// The MPI communicator under `mpirun -np 4`: every collective gives the same
// bits as the in-process communicator computes for the same inputs (each MPI
// rank also runs the four in-process ranks as threads), and a timeout names the
// rank that did not arrive.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>
#include <thread>

#include "backends/comm/launch.h"
#include "backends/comm/mpi_environment.h"
#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "tests/comm/reference.h"

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
    CHECK(ms >= 290);
    CHECK(ms < 800);
    Status later = c.barrier(world);
    REQUIRE_FALSE(later.ok());
    CHECK_THAT(later.error().message(), Catch::Contains("poisoned") && Catch::Contains("still waiting for rank 3"));
  }
  // Resynchronise outside the poisoned communicator so the job ends cleanly.
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
  auto env = MpiEnvironment::init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.error().message().c_str());
    return 1;
  }
  int failed = Catch::Session().run(argc, argv);
  // Every rank reports the job's verdict, so mpirun's exit status is the worst.
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
