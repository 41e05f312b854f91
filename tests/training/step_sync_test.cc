// How often a training step waits for the device. TrainingEngine::step reads the
// loss and the gradient norm back together, so a step blocks once; the step
// timer (engine/training/step_timing.h) and tracing (engine/tracing/) read their
// device times only where the step already waited. The cpu backend runs
// under DeviceClockBackend, which counts the calls that would block on an
// asynchronous device and, with a clock, gives device timing events.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "backends/cpu/comm/in_process.h"
#include "engine/tracing/tracing_backend.h"
#include "engine/training/step_timing.h"
#include "tests/parallel/parallel_harness.h"
#include "tests/tracing/device_clock_backend.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// Device time of the i-th timing event: 10 µs apart.
double ten_us_apart(std::int64_t i) { return 1e-5 * static_cast<double>(i); }

struct Counts {
  std::vector<std::int64_t> blocking;  // per step
  std::vector<double> losses;
  std::int64_t timings_read = 0;
  double comm_s = 0;  // the step timer's, over the steps
};

// kSteps steps of the tiny GPT under `p` on `cpu`, each between the step
// timer's begin_step and end_step as the trainer runs them, optionally with
// device timing and through a TracingBackend.
Status count_steps(Backend& cpu, const Plan& p, bool device_clock, TraceRecorder* recorder, Counts& out) {
  DeviceClockBackend counted(cpu, device_clock ? ten_us_apart : std::function<double(std::int64_t)>());
  std::optional<TracingBackend> traced;
  if (recorder != nullptr) traced.emplace(counted, *recorder);
  Backend& under = traced ? static_cast<Backend&>(*traced) : counted;
  {
    StepTimer timer(under);
    const ModelSpec m = tiny_gpt();
    TrainingEngine engine(timer, m, p, step_options());
    const int replica = Mesh(p).coord_of(cpu.rank()).dp, n = p.microbatches();
    for (int s = 1; s <= kSteps; ++s) {
      const std::vector<HostBatch> all = global_batch(m, s);
      const std::vector<HostBatch> mine(all.begin() + replica * n, all.begin() + (replica + 1) * n);
      const std::int64_t before = counted.blocking();
      timer.begin_step();
      MT_ASSIGN(const StepResult r, engine.step(mine, 1e-2f, s));
      MT_ASSIGN(const RankTiming t, timer.end_step());
      out.blocking.push_back(counted.blocking() - before);
      out.losses.push_back(r.loss);
      out.comm_s += t.comm_s;
    }
  }
  out.timings_read = counted.timings_read();
  return ok_status();
}

Counts single_rank(bool device_clock, bool trace) {
  Counts c;
  TraceRecorder recorder;
  REQUIRE(run_ranks(1, [&](int, Communicator& comm) {
            CpuBackend cpu(comm);
            return count_steps(cpu, make_plan(1, 1, 1, 0, ScheduleKind::gpipe), device_clock,
                               trace ? &recorder : nullptr, c);
          }).ok());
  return c;
}

}  // namespace

TEST_CASE("a single-rank step with clipping waits for the device once", "[train][sync]") {
  REQUIRE(step_options().optimizer.max_grad_norm > 0);  // the clip coefficient is computed on the device
  const Counts plain = single_rank(false, false);
  CHECK(plain.blocking == std::vector<std::int64_t>(kSteps, 1));
  CHECK(plain.timings_read == 0);

  SECTION("with the step timer on device timing") {
    const Counts timed = single_rank(true, false);
    CHECK(timed.blocking == std::vector<std::int64_t>(kSteps, 1));
    // The loss's and norm's collectives (one-rank groups) were timed and read back, not skipped.
    CHECK(timed.timings_read > 0);
    CHECK(timed.comm_s > 0);
    CHECK(timed.losses == plain.losses);
  }
  SECTION("and traced on the device as well") {
    const Counts traced = single_rank(true, true);
    CHECK(traced.blocking == std::vector<std::int64_t>(kSteps, 1));
    CHECK(traced.timings_read > 0);
    CHECK(traced.losses == plain.losses);
  }
}

TEST_CASE("a data-parallel step waits for the device once on every rank", "[train][sync]") {
  // ZeRO 1 all-gathers the updated parameters after the step's read: the timer
  // reads those timings after the next step's read instead of waiting for them.
  const int zero = GENERATE(0, 1);
  CAPTURE(zero);
  std::vector<Counts> ranks(2);
  REQUIRE(run_ranks(2, [&](int rank, Communicator& comm) {
            CpuBackend cpu(comm);
            return count_steps(cpu, make_plan(1, 1, 2, zero, ScheduleKind::gpipe), true, nullptr,
                               ranks[static_cast<std::size_t>(rank)]);
          }).ok());
  for (const Counts& c : ranks) {
    CHECK(c.blocking == std::vector<std::int64_t>(kSteps, 1));
    CHECK(c.timings_read > 0);
  }
  CHECK(ranks[0].losses == ranks[1].losses);
}
