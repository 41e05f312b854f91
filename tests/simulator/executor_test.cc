#include "tests/simulator/executor_fixture.h"

using namespace meshtrain::sim;

namespace {

using testing::make;
using testing::report_of;
using testing::st;

// A small pipeline: two devices compute, exchange with send/recv, then all
// four all-reduce; device 0 overlaps a second stream through an event.
std::string run_pipeline(RunReport* out) {
  Cluster c = make(16);
  CostConstants k;
  Executor e(c, k, {CollectiveMode::kFlows, true});
  for (int d = 0; d < 4; ++d) {
    StreamId s = st(e, d, "compute");
    REQUIRE(e.compute(s, e.intern("fwd"), 10 * kMicrosecond * (d + 1)).ok());
  }
  REQUIRE(e.send(st(e, 0, "compute"), 9, 64e6, e.intern("act")).ok());
  REQUIRE(e.recv(st(e, 9, "compute"), 0, e.intern("act")).ok());
  auto ar = e.add_collective({CollectiveKind::kAllReduce, {0, 1, 2, 3}, 256e6, Algorithm::kRing, 0},
                             e.intern("grad_ar"));
  REQUIRE(ar.ok());
  for (int d = 0; d < 4; ++d) REQUIRE(e.join_collective(st(e, d, "comm"), *ar).ok());
  REQUIRE(e.record(st(e, 0, "compute"), e.intern("fwd_done")).ok());
  REQUIRE(e.wait(st(e, 0, "side"), e.intern("fwd_done")).ok());
  REQUIRE(e.compute(st(e, 0, "side"), e.intern("opt"), 5 * kMicrosecond).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  if (out) *out = *r;
  return e.trace().to_json();
}

}  // namespace

TEST_CASE("executor: identical input gives identical trace bytes", "[simulator][executor]") {
  RunReport r;
  const std::string a = run_pipeline(&r);
  const std::string b = run_pipeline(nullptr);
  CHECK(a == b);
  CHECK_THAT(a, Catch::Contains(R"("ph":"s")") && Catch::Contains(R"("ph":"f")") &&
                    Catch::Contains(R"("name":"grad_ar")") && Catch::Contains("thread_name"));
  CHECK(r.collective_count[static_cast<int>(CollectiveKind::kAllReduce)] == 1);
  CHECK(r.collective_count[static_cast<int>(CollectiveKind::kSendRecv)] == 1);
  // The side stream waits for fwd (10 µs) and the send that follows it on the
  // compute stream is not part of the event: opt runs 10..15 µs.
  CHECK(report_of(r, 0, "side").busy == 5 * kMicrosecond);
  CHECK(r.makespan > 40 * kMicrosecond);
}

TEST_CASE("executor: streams, events and a collective's start", "[simulator][executor]") {
  Cluster c = make(8);
  CostConstants k;
  Executor e(c, k);
  StreamId a = st(e, 0, "a"), b = st(e, 0, "b"), c1 = st(e, 1, "main");
  REQUIRE(e.compute(a, e.intern("k1"), 10 * kMicrosecond).ok());
  REQUIRE(e.record(a, e.intern("ev")).ok());
  REQUIRE(e.wait(b, e.intern("ev")).ok());
  REQUIRE(e.compute(b, e.intern("k2"), 5 * kMicrosecond).ok());
  // A send/recv starts only when both sides reach it: device 1 computes 30 µs first.
  REQUIRE(e.compute(c1, e.intern("k3"), 30 * kMicrosecond).ok());
  REQUIRE(e.send(b, 1, 450e6, e.intern("x")).ok());
  REQUIRE(e.recv(c1, 0, e.intern("x")).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  // Transfer: 450 MB at 450 GB/s + 2 hops of 250 ns, starting at 30 µs.
  // While it runs nothing computes, so no slowdown applies.
  CHECK(r->makespan == 30 * kMicrosecond + kMillisecond + 500 * kNanosecond);
  CHECK(report_of(*r, 0, "b").busy == 5 * kMicrosecond + kMillisecond + 500 * kNanosecond);
  CHECK(report_of(*r, 0, "a").busy == 10 * kMicrosecond);
  CHECK(r->collective_time[static_cast<int>(CollectiveKind::kSendRecv)] ==
        kMillisecond + 500 * kNanosecond);
}

TEST_CASE("executor: communication slows concurrent compute on the same GPU",
          "[simulator][executor]") {
  Cluster c = make(8);
  CostConstants k;  // comm_compute_slowdown = 0.1
  Executor e(c, k);
  StreamId comp = st(e, 0, "compute"), comm = st(e, 0, "comm"), peer = st(e, 1, "comm");
  const Time work = 2 * kMillisecond;
  REQUIRE(e.compute(comp, e.intern("gemm"), work).ok());
  REQUIRE(e.send(comm, 1, 450e6, e.intern("x")).ok());
  REQUIRE(e.recv(peer, 0, e.intern("x")).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  // The transfer lasts T = 1 ms + 500 ns from 0; compute progresses T / 1.1
  // meanwhile and the rest at full speed after: end = T + work - T / 1.1.
  const double T = 1e-3 + 500e-9;
  const double want = T + to_seconds(work) - T / (1 + k.comm_compute_slowdown);
  CHECK(to_seconds(report_of(*r, 0, "compute").busy) == Approx(want).epsilon(1e-9));
}

TEST_CASE("executor: a collective can be timed analytically", "[simulator][executor]") {
  Cluster c = make(8);
  CostConstants k;
  const CollectiveRequest req{CollectiveKind::kAllGather, {0, 1, 2, 3}, 64e6, Algorithm::kRing, 0};
  Executor e(c, k);  // flows by default, analytic for this one
  auto ag = e.add_collective(req, e.intern("ag"), CollectiveMode::kAnalytic);
  REQUIRE(ag.ok());
  for (int d = 0; d < 4; ++d) REQUIRE(e.join_collective(st(e, d, "comm"), *ag).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  auto plan = plan_collective(c, k, req);
  REQUIRE(plan.ok());
  CHECK(r->collective_time[static_cast<int>(CollectiveKind::kAllGather)] ==
        analytic_time(c, k, *plan));
  CHECK(r->makespan == analytic_time(c, k, *plan));
}

TEST_CASE("executor: deadlock is an error naming the stuck streams", "[simulator][executor]") {
  Cluster c = make(8);
  CostConstants k;
  SECTION("recv before send on both sides") {
    Executor e(c, k);
    StreamId s0 = st(e, 0, "pp"), s1 = st(e, 1, "pp");
    REQUIRE(e.recv(s0, 1, e.intern("grad")).ok());
    REQUIRE(e.send(s0, 1, 1e6, e.intern("act")).ok());
    REQUIRE(e.recv(s1, 0, e.intern("act")).ok());
    REQUIRE(e.send(s1, 0, 1e6, e.intern("grad")).ok());
    // Device 1 receives act first, but device 0 first waits for grad: stuck.
    auto r = e.run();
    REQUIRE_FALSE(r.ok());
    const std::string m = r.error().message();
    CHECK_THAT(m, Catch::Contains("deadlock: 2 streams"));
    CHECK_THAT(m,
               Catch::Contains(
                   "device 0 stream 'pp' task 0 'grad': recv from device 1 waiting for its send"));
    CHECK_THAT(m, Catch::Contains("device 1 stream 'pp' task 0 'act': recv from device 0"));
  }
  SECTION("a member never joins a collective") {
    Executor e(c, k);
    auto ar = e.add_collective({CollectiveKind::kAllReduce, {0, 1, 2}, 1e6, Algorithm::kAuto, 0},
                               e.intern("ar"));
    REQUIRE(ar.ok());
    REQUIRE(e.join_collective(st(e, 0, "comm"), *ar).ok());
    REQUIRE(e.join_collective(st(e, 1, "comm"), *ar).ok());
    auto r = e.run();
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains("all_reduce waiting for devices [2] to join") &&
                                        Catch::Contains("2 of 3 members ever joined"));
  }
  SECTION("bad submissions are errors") {
    Executor e(c, k);
    CHECK_FALSE(e.stream(99, "x").ok());
    auto ar = e.add_collective({CollectiveKind::kAllReduce, {0, 1}, 1e6, Algorithm::kAuto, 0},
                               e.intern("ar"));
    REQUIRE(ar.ok());
    auto j = e.join_collective(st(e, 5, "comm"), *ar);
    REQUIRE_FALSE(j.ok());
    CHECK_THAT(j.error().message(), Catch::Contains("device 5 is not a member"));
    CHECK_FALSE(e.send(st(e, 0, "s"), 0, 1, e.intern("self")).ok());
    CHECK_FALSE(e.compute(st(e, 0, "s"), e.intern("neg"), -1).ok());
  }
}

// Rank threads of one 2-core machine, calibrated with 4 of them computing at
// once (1 thread each, half a core each): a task's calibrated time holds
// while 4 compute; with k < 4 computing each runs min(1, 2/k) / (1/2) as fast.
TEST_CASE("executor: rank threads sharing a machine's cores speed up when others wait",
          "[simulator][executor][host]") {
  Cluster c = make(8);
  CostConstants k;
  const HostSharing two_cores{2, 1, 0.5};
  auto run = [&](std::vector<Time> work, std::vector<double> ranks) {
    Executor e(c, k);
    ranks.resize(8, 1.0);
    REQUIRE(e.share_host(two_cores, ranks).ok());
    for (int d = 0; d < static_cast<int>(work.size()); ++d)
      if (work[static_cast<std::size_t>(d)] > 0)
        REQUIRE(e.compute(st(e, d, "compute"), e.intern("k"), work[static_cast<std::size_t>(d)]).ok());
    auto r = e.run();
    REQUIRE(r.ok());
    return *r;
  };
  const Time us = kMicrosecond;
  // Four at once: the calibrated time.
  CHECK(run({10 * us, 10 * us, 10 * us, 10 * us}, {}).makespan == 10 * us);
  // Two at once: a core each, twice the calibrated speed.
  CHECK(run({10 * us, 10 * us}, {}).makespan == 5 * us);
  // One alone still has one thread: a core, not two.
  CHECK(run({10 * us}, {}).makespan == 5 * us);
  // 4 run 10 µs at speed 1; then 3 share 2 cores (speed 4/3): the 20 µs left take 15 µs.
  const RunReport mixed = run({10 * us, 30 * us, 30 * us, 30 * us}, {});
  CHECK(mixed.makespan == 25 * us);
  CHECK(report_of(mixed, 0, "compute").busy == 10 * us);
  // A representative standing for two ranks: two devices of weight 2 are four ranks computing.
  CHECK(run({10 * us, 10 * us}, {2, 2}).makespan == 10 * us);
  CHECK(run({10 * us}, {2}).makespan == 5 * us);
  // Not a machine: refused by name.
  Executor e(c, k);
  CHECK_THAT(e.share_host({2, 1, 0}, std::vector<double>(8, 1.0)).error().message(),
             Catch::Contains("calibrated share"));
  CHECK_THAT(e.share_host(two_cores, {1.0}).error().message(), Catch::Contains("1 device weights for 8"));
}

TEST_CASE("host sharing: the calibration's level and the plan's threads per rank", "[simulator][host]") {
  Calibration cal;
  cal.machine.backend = "cpu";
  cal.machine.cores = 2;
  cal.gemm.push_back({64, 64, 64, DType::kFp32, 10, {}});
  cal.gemm.back().spread.ranks_sharing = 4;
  // Calibrated with 4 rank threads (1 thread each, half a core); the plan has 4.
  HostSharing h = host_sharing_for(cal, 4);
  CHECK(h.cores == 2);
  CHECK(h.threads_per_rank == 1);
  CHECK(h.calibrated_share == 0.5);
  CHECK(h.speed(4) == 1.0);
  CHECK(h.speed(2) == 2.0);
  // Levels 1 and 2: a 2-rank plan has a core per rank as measured, alone or not.
  cal.gemm.back().spread.ranks_sharing = 2;
  cal.gemm.push_back(cal.gemm.back());
  cal.gemm.back().spread.ranks_sharing = 1;
  h = host_sharing_for(cal, 2);
  CHECK(h.calibrated_share == 1.0);
  CHECK(h.speed(1) == 1.0);
  CHECK(h.speed(2) == 1.0);
  // One rank: two threads, as measured at level 1.
  h = host_sharing_for(cal, 1);
  CHECK(h.threads_per_rank == 2);
  CHECK(h.calibrated_share == 1.0);
  // A GPU calibration shares nothing.
  cal.machine.backend = "";
  CHECK_FALSE(host_sharing_for(cal, 4).on());
}
