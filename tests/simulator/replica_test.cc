// Full fidelity in the executor: replicas run a source device's streams
// with devices mapped, and must time exactly what submitting every device's
// tasks explicitly times; straggler factors, merged compute runs and the
// isolation of exclusive links change only what they document.
#include <catch2/catch.hpp>
#include <map>

#include "simulator/executor.h"

using namespace meshtrain::sim;

namespace {

// 32 GPUs (4 dgx-h100 nodes) as a job of tp 8, dp 2, pp 2:
// rank = t + 8·d + 16·p, so a tp group is a node, a dp group spans two
// nodes on one rail and pipeline neighbours are two nodes apart.
constexpr int kTp = 8, kDp = 2, kPp = 2, kWorld = kTp * kDp * kPp;
struct Coord {
  int t, d, p;
};
Coord coord(int r) { return {r % kTp, (r / kTp) % kDp, r / (kTp * kDp)}; }
int rank_of(Coord c) { return c.t + kTp * c.d + kTp * kDp * c.p; }

std::vector<int> tp_group(int r) {
  std::vector<int> g;
  for (int t = 0; t < kTp; ++t) g.push_back(rank_of({t, coord(r).d, coord(r).p}));
  return g;
}
std::vector<int> dp_group(int r) {
  std::vector<int> g;
  for (int d = 0; d < kDp; ++d) g.push_back(rank_of({coord(r).t, d, coord(r).p}));
  return g;
}

struct Scenario {
  bool replicas = false;
  ExecutorOptions options;
  std::map<int, double> stragglers;
  int steps = 3;
};

struct Outcome {
  RunReport report;
  std::vector<Time> end;  // by device: its streams' last finish
};

Outcome run(const Scenario& sc) {
  auto cluster = Cluster::build(*cluster_preset("dgx-h100"), kWorld);
  REQUIRE(cluster.ok());
  CostConstants k;
  Executor e(*cluster, k, sc.options);
  // The k-th collective of a group is created by its first member to reach it.
  std::map<std::vector<int>, std::vector<CollectiveId>> made;
  std::map<std::pair<std::vector<int>, int>, size_t> calls;
  auto join = [&](StreamId s, int rank, std::vector<int> members, double bytes, const char* name) {
    auto& list = made[members];
    const size_t n = calls[{members, rank}]++;
    if (n == list.size()) {
      auto id = e.add_collective({CollectiveKind::kAllReduce, members, bytes, Algorithm::kAuto, 0}, e.intern(name));
      REQUIRE(id.ok());
      list.push_back(*id);
    }
    REQUIRE(e.join_collective(s, list[n]).ok());
  };
  auto issue = [&](int r) {
    const StreamId s = *e.stream(r, "compute");
    const StreamId c = *e.stream(r, "comm");
    const int p = coord(r).p;
    for (int step = 0; step < sc.steps; ++step) {
      REQUIRE(e.compute(s, e.intern("fwd"), (10 + 5 * p) * kMicrosecond).ok());
      join(s, r, tp_group(r), 32e6, "tp all-reduce");
      if (p == 0) REQUIRE(e.send(s, r + kTp * kDp, 16e6, e.intern("act")).ok());
      else REQUIRE(e.recv(s, r - kTp * kDp, e.intern("act")).ok());
      REQUIRE(e.compute(s, e.intern("bwd"), 20 * kMicrosecond).ok());
      REQUIRE(e.compute(s, e.intern("bwd2"), 7 * kMicrosecond).ok());
      REQUIRE(e.record(s, e.intern("grads")).ok());
      REQUIRE(e.wait(c, e.intern("grads")).ok());
      join(c, r, dp_group(r), 64e6, "dp all-reduce");
      REQUIRE(e.record(c, e.intern("synced")).ok());
      REQUIRE(e.wait(s, e.intern("synced")).ok());
      REQUIRE(e.compute(s, e.intern("opt"), 3 * kMicrosecond).ok());
    }
  };
  if (sc.replicas) {
    for (int p = 0; p < kPp; ++p) issue(rank_of({0, 0, p}));
    for (int r = 0; r < kWorld; ++r) {
      const Coord c = coord(r);
      if (c.t == 0 && c.d == 0) continue;
      auto map = [c](int q) {
        const Coord x = coord(q);
        return rank_of({(x.t + c.t) % kTp, (x.d + c.d) % kDp, x.p});
      };
      REQUIRE(e.replicate(rank_of({0, 0, c.p}), r, map).ok());
    }
  } else {
    for (int r = 0; r < kWorld; ++r) issue(r);
  }
  for (auto [dev, f] : sc.stragglers) REQUIRE(e.set_compute_factor(dev, f).ok());
  auto report = e.run();
  if (!report.ok()) FAIL(report.error().message());
  Outcome out{*report, std::vector<Time>(kWorld, 0)};
  for (const auto& s : report->streams) out.end[s.device] = std::max(out.end[s.device], s.end);
  return out;
}

}  // namespace

TEST_CASE("replicas time what every device's own tasks time", "[simulator][replicas]") {
  for (bool straggler : {false, true}) {
    CAPTURE(straggler);
    Scenario explicit_tasks, replicated;
    replicated.replicas = true;
    if (straggler) explicit_tasks.stragglers = replicated.stragglers = {{rank_of({3, 1, 0}), 1.7}};
    const Outcome a = run(explicit_tasks), b = run(replicated);
    CHECK(b.report.makespan == a.report.makespan);
    CHECK(b.end == a.end);
    CHECK(b.report.tasks_run == a.report.tasks_run);
    CHECK(b.report.collective_count == a.report.collective_count);
    CHECK(b.report.flows == a.report.flows);
    CHECK(b.report.collective_bytes == a.report.collective_bytes);
  }
}

TEST_CASE("a straggler's compute runs slower and its peers wait for it", "[simulator][replicas]") {
  Scenario base, slow;
  base.replicas = slow.replicas = true;
  const int r = rank_of({3, 1, 0});
  slow.stragglers = {{r, 2.0}};
  const Outcome a = run(base), b = run(slow);
  CHECK(b.report.makespan > a.report.makespan);
  // Its tp peers finish no earlier than it (they wait in the all-reduce).
  for (int q : tp_group(r)) CHECK(b.end[q] > a.end[q]);
  // The compute it ran took longer; a rank of the other stage has the same compute.
  auto compute_of = [](const Outcome& o, int dev) {
    Time t = 0;
    for (const auto& s : o.report.streams)
      if (s.device == dev) t += s.compute;
    return t;
  };
  CHECK(compute_of(b, r) > compute_of(a, r) * 19 / 10);
  CHECK(compute_of(b, rank_of({3, 1, 1})) == compute_of(a, rank_of({3, 1, 1})));
}

TEST_CASE("merged compute runs change the timing by rounding only", "[simulator][replicas]") {
  Scenario base, merged;
  base.replicas = merged.replicas = true;
  merged.options.merge_compute = true;
  const Outcome a = run(base), b = run(merged);
  CHECK(std::llabs(b.report.makespan - a.report.makespan) <= 100);  // picoseconds
  CHECK(b.report.tasks_run < a.report.tasks_run);
  CHECK(b.report.events < a.report.events);
}

TEST_CASE("collectives alone on their links are timed analytically, as their flows", "[simulator][replicas]") {
  Scenario flows, isolated;
  flows.replicas = isolated.replicas = true;
  isolated.options.isolate_exclusive = true;
  const Outcome a = run(flows), b = run(isolated);
  // The tp groups (a node's NVSwitch ports, nobody else's) are isolated; the
  // dp all-reduces share their NICs with the pipeline's sends: flows.
  CHECK(b.report.isolated_collectives == static_cast<uint64_t>(kDp * kPp * 3));
  CHECK(b.report.isolated_overlaps == 0);
  CHECK(b.report.flows < a.report.flows);
  CHECK(b.report.makespan == Approx(a.report.makespan).epsilon(1e-4));
}

TEST_CASE("a replica that cannot meet its peers is named in the deadlock", "[simulator][replicas]") {
  auto cluster = Cluster::build(*cluster_preset("dgx-h100"), 16);
  REQUIRE(cluster.ok());
  CostConstants k;
  Executor e(*cluster, k);
  // Device 0 all-reduces with device 1; its replica, device 8, is mapped onto
  // {8, 9}, but device 9 never runs anything.
  auto ar = e.add_collective({CollectiveKind::kAllReduce, {0, 1}, 1e6, Algorithm::kAuto, 0}, e.intern("ar"));
  REQUIRE(ar.ok());
  REQUIRE(e.join_collective(*e.stream(0, "compute"), *ar).ok());
  REQUIRE(e.join_collective(*e.stream(1, "compute"), *ar).ok());
  REQUIRE(e.replicate(0, 8, [](int d) { return d + 8; }).ok());
  auto r = e.run();
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message(), Catch::Contains("device 8 stream 'compute'") &&
                                      Catch::Contains("(running device 0's streams) all_reduce waiting for devices [9]"));
}
