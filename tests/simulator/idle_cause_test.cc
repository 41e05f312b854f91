// Overlap of bucketed gradient reductions with backward, and the idle time
// it leaves, worked by hand (simulator/executor.h, "Idle by cause").
#include "tests/simulator/executor_fixture.h"

using namespace meshtrain::sim;

namespace {

using testing::make;
using testing::report_of;
using testing::st;

// Equal to a few picoseconds: compute progress is tracked in doubles.
bool near(Time a, Time b) { return a - b <= 10 && b - a <= 10; }

Time idle_of(const StreamReport& s, IdleCause::Wait wait, const std::string& task) {
  Time t = 0;
  for (const IdleCause& c : s.idle)
    if (c.wait == wait && c.task == task) t += c.time;
  return t;
}

// Two data-parallel ranks on one node, two gradient buckets, Megatron's
// --overlap-grad-reduce: backward of the second half (B2) completes bucket 2,
// whose reduce-scatter starts on the data-parallel stream at once while
// backward of the first half (B1) runs; bucket 1's reduce-scatter starts
// when B1 ends and after bucket 2's. The compute stream then waits for the
// last reduction and runs the next forward F.
struct TwoBuckets {
  Time b2, b1, f, rs;  // inputs and the reduce-scatter's own time
  RunReport report;
};

TwoBuckets run_two_buckets(Time backward_half, double bucket_bytes) {
  Cluster c = make(8);
  CostConstants k;
  k.comm_compute_slowdown = 0;  // hand arithmetic: no SM sharing between the two
  TwoBuckets out{backward_half, backward_half, 5 * kMillisecond, 0, {}};
  const CollectiveRequest rs{CollectiveKind::kReduceScatter, {0, 1}, bucket_bytes, Algorithm::kAuto, 0};
  auto alone = simulate_collective(c, k, rs, CollectiveMode::kAnalytic);
  REQUIRE(alone.ok());
  out.rs = alone->duration;
  Executor e(c, k, {CollectiveMode::kAnalytic, true});
  std::vector<CollectiveId> buckets;
  for (int i = 0; i < 2; ++i) {
    auto id = e.add_collective(rs, e.intern("reduce_scatter"));
    REQUIRE(id.ok());
    buckets.push_back(*id);
  }
  for (int d = 0; d < 2; ++d) {
    const StreamId compute = st(e, d, "compute"), dp = st(e, d, "data-parallel 1");
    REQUIRE(e.compute(compute, e.intern("backward"), out.b2).ok());
    REQUIRE(e.record(compute, e.intern("bucket 2 ready")).ok());
    REQUIRE(e.compute(compute, e.intern("backward"), out.b1).ok());
    REQUIRE(e.record(compute, e.intern("bucket 1 ready")).ok());
    REQUIRE(e.wait(dp, e.intern("bucket 2 ready")).ok());
    REQUIRE(e.join_collective(dp, buckets[0]).ok());
    REQUIRE(e.wait(dp, e.intern("bucket 1 ready")).ok());
    REQUIRE(e.join_collective(dp, buckets[1]).ok());
    REQUIRE(e.record(dp, e.intern("reduced")).ok());
    REQUIRE(e.wait(compute, e.intern("reduced")).ok());
    REQUIRE(e.compute(compute, e.intern("forward"), out.f).ok());
  }
  auto r = e.run();
  REQUIRE(r.ok());
  out.report = *r;
  return out;
}

}  // namespace

TEST_CASE("two-bucket overlap: the second reduction's tail is exposed, charged to it", "[simulator][idle]") {
  // Bucket 2's reduce-scatter (rs) hides under B1 when rs <= B1; bucket 1's
  // starts at max(B2 + B1, B2 + rs) and is exposed whole: the step is
  // B2 + max(B1, rs) + rs + F, and the compute stream idles for
  // max(B1, rs) - B1 + rs, all of it waiting for the data-parallel stream's
  // reduce_scatter.
  for (Time half : {20 * kMillisecond, 1 * kMillisecond}) {
    const TwoBuckets t = run_two_buckets(half, 256e6);
    INFO("backward half " << to_seconds(half) << " s, reduce-scatter " << to_seconds(t.rs) << " s");
    const Time step = t.b2 + std::max(t.b1, t.rs) + t.rs + t.f;
    CHECK(near(t.report.makespan, step));
    const StreamReport& compute = report_of(t.report, 0, "compute");
    const Time idle = std::max(t.b1, t.rs) - t.b1 + t.rs;
    CHECK(near(idle_of(compute, IdleCause::Wait::kEvent, "reduce_scatter"), idle));
    for (const IdleCause& c : compute.idle)
      if (c.task == "reduce_scatter") {
        CHECK(c.stream == "data-parallel 1");
        CHECK(c.communication);
      }
    // The data-parallel stream idles until B2 ends, then (when rs < B1) for B1's remainder.
    const StreamReport& dp = report_of(t.report, 0, "data-parallel 1");
    CHECK(near(idle_of(dp, IdleCause::Wait::kEvent, "backward"), t.b2 + std::max<Time>(0, t.b1 - t.rs)));
  }
}

TEST_CASE("idle by cause: pipeline waits, peers and the tail", "[simulator][idle]") {
  Cluster c = make(16);
  CostConstants k;
  Executor e(c, k, {CollectiveMode::kAnalytic, true});
  // Device 8 (another node) waits for device 0's activation until device 0 reaches its send.
  REQUIRE(e.compute(st(e, 0, "compute"), e.intern("forward"), 3 * kMillisecond).ok());
  REQUIRE(e.send(st(e, 0, "compute"), 8, 1e3, e.intern("act")).ok());
  REQUIRE(e.recv(st(e, 8, "compute"), 0, e.intern("act")).ok());
  REQUIRE(e.compute(st(e, 8, "compute"), e.intern("forward"), 1 * kMillisecond).ok());
  // Device 0's side stream runs 10 ms of optimizer work (sharing the device with the forward for a while): the
  // compute stream's tail waits for it.
  REQUIRE(e.compute(st(e, 0, "data-parallel 1"), e.intern("adamw"), 10 * kMillisecond).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  const StreamReport& d8 = report_of(*r, 8, "compute");
  // Idle from 0 until the transfer starts, when device 0's forward ends and its send is reached.
  const StreamReport& d0 = report_of(*r, 0, "compute");
  const Time forward_end = d0.end - (d0.busy - d0.compute);  // the send's transfer is its busy time past the forward
  CHECK(near(idle_of(d8, IdleCause::Wait::kTransfer, "act"), forward_end));
  CHECK(forward_end >= 3 * kMillisecond);
  Time tail = 0;
  for (const IdleCause& x : d0.idle)
    if (x.wait == IdleCause::Wait::kTail) {
      CHECK(x.stream == "data-parallel 1");
      CHECK(x.task == "adamw");
      CHECK_FALSE(x.communication);
      tail += x.time;
    }
  CHECK(near(tail, report_of(*r, 0, "data-parallel 1").end - d0.end));
  // Every stream's causes add up to its idle time: makespan minus busy.
  for (const StreamReport& s : r->streams) {
    Time sum = 0;
    for (const IdleCause& x : s.idle) sum += x.time;
    CHECK(near(sum, r->makespan - s.busy));
  }
  // The trace carries the compute streams' idle slices.
  CHECK_THAT(e.trace().to_json(), Catch::Contains(R"("cat":"idle")") &&
                                      Catch::Contains("waits for the peer of act"));
}

TEST_CASE("a collective timed elsewhere and issued as a marked task is charged as communication",
          "[simulator][idle]") {
  // Representative fidelity times a collective whose members are not all
  // simulated analytically and issues it as one task of that duration: a
  // stream waiting for it waited for communication (exposed data-parallel),
  // not for the optimizer's kernels on the same stream.
  Cluster c = make(8);
  CostConstants k;
  Executor e(c, k, {CollectiveMode::kAnalytic, true, true});
  const StreamId compute = st(e, 0, "compute"), dp = st(e, 0, "data-parallel 1");
  REQUIRE(e.compute(compute, e.intern("backward"), 1 * kMillisecond).ok());
  REQUIRE(e.record(compute, e.intern("grads")).ok());
  REQUIRE(e.wait(dp, e.intern("grads")).ok());
  REQUIRE(e.compute(dp, e.intern("reduce_scatter"), 4 * kMillisecond, true).ok());
  REQUIRE(e.compute(dp, e.intern("adamw"), 1 * kMillisecond).ok());
  REQUIRE(e.record(dp, e.intern("updated")).ok());
  REQUIRE(e.wait(compute, e.intern("updated")).ok());
  REQUIRE(e.compute(compute, e.intern("forward"), 1 * kMillisecond).ok());
  auto r = e.run();
  REQUIRE(r.ok());
  const StreamReport& s = report_of(*r, 0, "compute");
  bool reduce_scatter = false, adamw = false;
  for (const IdleCause& x : s.idle) {
    if (x.task == "reduce_scatter") {
      reduce_scatter = true;
      CHECK(x.communication);
      CHECK(near(x.time, 4 * kMillisecond));
    }
    if (x.task == "adamw") {
      adamw = true;
      CHECK_FALSE(x.communication);
      CHECK(near(x.time, 1 * kMillisecond));
    }
  }
  CHECK(reduce_scatter);
  CHECK(adamw);
  // merge_compute (the third option above) keeps the two apart: merged, the
  // reduce-scatter would have lost its mark or the AdamW gained it.
  CHECK(near(r->makespan, 7 * kMillisecond));
}
