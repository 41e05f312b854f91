// Full fidelity and what-ifs (engine/simulation/simulation.h, engine/simulation/variation.h):
// every rank's ops and flows agree with the representative ranks on plans
// without variation, the exclusive-link shortcut agrees with plain flows,
// and a straggler, a degraded cable and a failed cable cost what they should
// (a failure with no path left stops the job).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/simulation/simulation.h"
#include "engine/simulation/variation.h"

using namespace meshtrain;

namespace {

ModelSpec model() {
  auto m = load_model("gpt2-124m");
  REQUIRE(m.ok());
  return *m;
}

Plan plan(int tp, int pp, int dp, int zero = 0) {
  Plan p;
  p.tp = tp, p.pp = pp, p.dp = dp, p.zero = zero;
  p.micro_batch = 2;
  p.global_batch = p.micro_batch * dp * 4;
  p.seq_len = 512;
  REQUIRE(validate_plan(p, model(), p.world_size()).ok());
  return p;
}

SimulationResult simulate(const Plan& p, Fidelity f, Variation v = {}, bool isolate = true) {
  SimulateOptions o;
  o.cluster = *sim::cluster_preset("dgx-a100");
  o.fidelity = f;
  o.variation = std::move(v);
  o.isolate_exclusive = isolate;
  auto r = simulate_iteration(model(), p, o);
  INFO((r.ok() ? std::string() : r.error().message()));
  REQUIRE(r.ok());
  return std::move(r).value();
}

}  // namespace

TEST_CASE("full fidelity agrees with the representative ranks on plans without variation", "[sim][fidelity]") {
  // tp inside a node, dp and pp across nodes, ZeRO 1; 8 to 32 GPUs of dgx-a100.
  for (const Plan& p : {plan(2, 2, 4), plan(4, 1, 2), plan(1, 4, 4), plan(2, 2, 2, 1), plan(4, 2, 4)}) {
    CAPTURE(p.tp, p.pp, p.dp, p.zero);
    const SimulationResult rep = simulate(p, Fidelity::representative);
    const SimulationResult full = simulate(p, Fidelity::full);
    CHECK(full.fidelity == Fidelity::full);
    CHECK(full.tasks > rep.tasks);
    // Contention the representatives cannot see (dp rings and pipeline
    // sends sharing NICs) only slows full fidelity down, and not by much.
    CHECK(full.iteration_s >= rep.iteration_s * 0.999);
    CHECK(full.iteration_s <= rep.iteration_s * 1.05);
    // Identical ranks compute identically.
    CHECK(full.slowest_compute_s == Approx(full.median_compute_s).epsilon(1e-6));
  }
}

TEST_CASE("collectives timed analytically on exclusive links agree with their flows", "[sim][fidelity]") {
  for (const Plan& p : {plan(2, 2, 4), plan(4, 2, 4)}) {
    const SimulationResult flows = simulate(p, Fidelity::full, {}, false);
    const SimulationResult shortcut = simulate(p, Fidelity::full, {}, true);
    CHECK(shortcut.isolated_collectives > 0);
    CHECK(flows.isolated_collectives == 0);
    CHECK(shortcut.flows < flows.flows);
    CHECK(shortcut.isolated_overlaps == 0);
    CHECK(shortcut.iteration_s == Approx(flows.iteration_s).epsilon(2e-3));
  }
}

TEST_CASE("a straggler computes slower, its peers wait, and it is named", "[sim][fidelity]") {
  const Plan p = plan(2, 2, 4);
  const SimulationResult base = simulate(p, Fidelity::representative);
  Variation v;
  v.stragglers = {{5, 1.5}};
  const SimulationResult slow = simulate(p, Fidelity::representative, v);  // variation: full fidelity
  CHECK(slow.fidelity == Fidelity::full);
  CHECK(slow.slowest_rank == 5);
  CHECK(slow.slowest_compute_s / slow.median_compute_s == Approx(1.5).epsilon(0.05));
  CHECK(slow.iteration_s > base.iteration_s * 1.05);
  // No worse than every rank being that slow.
  Variation all;
  auto every = parse_stragglers({"0-15:1.5"}, 16, 1);
  REQUIRE(every.ok());
  all.stragglers = *every;
  CHECK(slow.iteration_s <= simulate(p, Fidelity::full, all).iteration_s * 1.001);
}

TEST_CASE("straggler specs: ranks, ranges, random with a seed, and errors", "[sim][fidelity]") {
  auto r = parse_stragglers({"17:1.3", "3,5,8-10:2"}, 32, 7);
  REQUIRE(r.ok());
  CHECK(*r == std::map<int, double>{{3, 2}, {5, 2}, {8, 2}, {9, 2}, {10, 2}, {17, 1.3}});
  auto a = parse_stragglers({"random:0.1:1.2"}, 1024, 42);
  auto b = parse_stragglers({"random:0.1:1.2"}, 1024, 42);
  auto c = parse_stragglers({"random:0.1:1.2"}, 1024, 43);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(a->size() == 102);
  CHECK(*a == *b);
  CHECK(*a != *c);
  CHECK(parse_stragglers({"random:0.0001:2"}, 64, 1)->size() == 1);
  auto error = [](std::vector<std::string> specs) {
    auto e = parse_stragglers(specs, 32, 1);
    REQUIRE_FALSE(e.ok());
    return e.error().message();
  };
  CHECK_THAT(error({"40:1.3"}), Catch::Contains("rank 40 is outside the world of 32 ranks"));
  CHECK_THAT(error({"3:0"}), Catch::Contains("in (0, 1000]"));
  CHECK_THAT(error({"3:1e300"}), Catch::Contains("in (0, 1000]"));
  CHECK_THAT(error({"3"}), Catch::Contains("write RANKS:FACTOR"));
  CHECK_THAT(error({"5-2:2"}), Catch::Contains("runs backwards"));
  CHECK_THAT(error({"1:2", "0-3:1.5"}), Catch::Contains("rank 1 is already a straggler"));
  CHECK_THAT(error({"random:1.5:2"}), Catch::Contains("(0, 1]"));
  CHECK_THAT(parse_link_degrade("leaf2-spine7").error().message(), Catch::Contains("write CABLE:FACTOR"));
  CHECK_THAT(parse_link_degrade("leaf2-spine7:1.5").error().message(), Catch::Contains("(0, 1]"));
  CHECK(parse_link_degrade("leaf2-spine7:0.5")->cable == "leaf2-spine7");
}

TEST_CASE("a degraded cable slows the job and a failed one reroutes or stops it", "[sim][fidelity]") {
  const Plan p = plan(2, 2, 4);  // 16 GPUs: two nodes under one leaf per rail
  const double base = simulate(p, Fidelity::full).iteration_s;
  SECTION("degraded") {
    Variation v;
    v.links = {*parse_link_degrade("node0.nic1:0.1")};
    CHECK(simulate(p, Fidelity::full, v).iteration_s > base * 1.01);
  }
  SECTION("failed NIC: its traffic leaves through the PCIe sibling's NIC") {
    Variation v;
    v.links = {link_failure("node0.nic1")};
    const double t = simulate(p, Fidelity::full, v).iteration_s;
    CHECK(t >= base * 0.999);
  }
  SECTION("no working path: the job stops") {
    Plan one = plan(2, 2, 2);  // 8 GPUs, one node: no network to go around
    Variation v;
    v.links = {link_failure("node0.gpu2"), link_failure("node0.pcie2")};
    SimulateOptions o;
    o.cluster = *sim::cluster_preset("dgx-a100");
    o.variation = v;
    auto r = simulate_iteration(model(), one, o);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains("no working path from GPU") && Catch::Contains("node0.gpu2, node0.pcie2 down: the job stops"));
  }
  SECTION("an unknown cable is named") {
    Variation v;
    v.links = {link_failure("leaf99-spine0")};
    SimulateOptions o;
    o.cluster = *sim::cluster_preset("dgx-a100");
    o.variation = v;
    auto r = simulate_iteration(model(), p, o);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains("leaf99-spine0"));
  }
}
