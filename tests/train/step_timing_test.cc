// StepTimer and the straggler report (engine/training/step_timing.h) without a
// training run: communication is timed apart from compute, including the
// wait for peers, and the report compares ranks of a stage.
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <thread>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/training/fault_injection.h"
#include "engine/training/step_timing.h"

using namespace meshtrain;

TEST_CASE("the report names the rank that lags its stage's median", "[train][straggler]") {
  // Two stages; stage 1 computes more; rank 2 (stage 0) is slow.
  const std::vector<RankTiming> t = {{1.0, 0.5, 2}, {1.1, 0.4, 2}, {3.0, 0.1, 2}, {2.0, 0.2, 2},
                                     {2.1, 0.1, 2}, {2.2, 0.1, 2}};
  const std::vector<int> stage = {0, 0, 0, 1, 1, 1};
  StragglerReport r = straggler_report(t, stage);
  CHECK(r.slowest_rank == 2);
  CHECK(r.median_compute_s == 1.1);
  CHECK(r.lag_s == Approx(1.9));
  // One rank per stage: every rank against all of them.
  r = straggler_report({{1.0, 0, 1}, {1.5, 0, 1}}, {0, 1});
  CHECK(r.slowest_rank == 1);
  CHECK(r.median_compute_s == 1.0);  // the lower median: of two, the faster
  r = straggler_report({{1.0, 0, 1}, {1.0, 0, 1}, {1.0, 0, 1}}, {0, 0, 0});
  CHECK(r.lag_s == 0);
}

TEST_CASE("StepTimer counts the wait for a slow peer as communication", "[train][straggler]") {
  std::vector<RankTiming> timing(2);
  Status s = run_ranks(2, [&](int rank, Communicator& c) -> Status {
    CpuBackend cpu(c);
    StepTimer timer(cpu);
    FaultInjector faults({Fault{Fault::Kind::slow, 1, 1, 3}}, rank, false, std::chrono::seconds(1));
    timer.on_communication([&](double compute_s) { faults.before_communication(compute_s); });
    faults.begin_step(1);
    timer.begin_step();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < until) {  // 50 ms of "compute" on both ranks
    }
    Tensor x = timer.empty(Shape{4});
    timer.fill(x, 1.f);
    timer.all_reduce(x, Group{0, {0, 1}}, ReduceOp::sum);
    MT_ASSIGN(timing[static_cast<std::size_t>(rank)], timer.end_step());
    return ok_status();
  });
  REQUIRE(s.ok());
  // Rank 1 computes 50 ms and sleeps 100 more (factor 3); rank 0 waits for it.
  // Lower bounds only, and comparisons between the ranks: load on the machine
  // can stretch any interval, but never shorten one below what was slept.
  CHECK(timing[1].compute_s > 0.14);
  CHECK(timing[0].compute_s > 0.045);
  CHECK(timing[0].compute_s < timing[1].compute_s);  // rank 0's wait is not compute...
  CHECK(timing[1].comm_s < timing[0].comm_s);        // ...but communication
}

TEST_CASE("fault specs parse", "[train][faults]") {
  auto f = parse_fault("3:slow:5:2.5");
  REQUIRE(f.ok());
  CHECK(f->rank == 3);
  CHECK(f->kind == Fault::Kind::slow);
  CHECK(f->step == 5);
  CHECK(f->factor == 2.5);
  CHECK(parse_fault("0:exit:1")->kind == Fault::Kind::exit);
  CHECK(parse_fault("0:hang:7")->step == 7);
  CHECK_FALSE(parse_fault("0:hang:0").ok());
  CHECK_FALSE(parse_fault("a:hang:1").ok());
  CHECK_FALSE(parse_fault("0:slow:1:0.5").ok());
  // A crash names its signal with or without SIG, and prints back without it.
  CHECK(parse_fault("1:signal:2:SIGSEGV")->signal == SIGSEGV);
  CHECK(fault_spec(*parse_fault("1:signal:2:ABRT")) == "1:signal:2:ABRT");
  CHECK(parse_fault("0:throw:4")->kind == Fault::Kind::throw_);
  CHECK_FALSE(parse_fault("0:signal:1:HUP").ok());
}
