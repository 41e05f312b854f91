// Overlap and prefetch simulated: what the traces show and what the
// iteration gains. The optimizer update off the critical path
// (Plan::overlap_update) moves ops from the compute stream to the
// data-parallel stream; the steady-state iteration (SimulateOptions::
// steady_state) must shrink by those ops' durations, read from the trace of
// the plan without it, less the update the next forward's first layer still
// waits for. ZeRO-3's prefetch across chunks (Plan::prefetch_across_chunks)
// must leave fewer gathers that start while the compute stream has nothing to run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/simulation/simulation.h"
#include "tests/sim_backend/sim_testing.h"
#include "tests/sim_backend/trace_streams.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

// Rank 0's complete events by stream: "compute" and "data-parallel", each sorted by start.
struct RankTrace {
  std::vector<TraceOp> compute, dp;
};

RankTrace rank0_trace(const std::string& json) {
  const auto streams = rank0_streams(json);
  return {stream_ops(streams, "compute"), stream_ops(streams, "data-parallel")};
}

// Σ durations (µs) and count of the ops named `name` in `ops`.
std::pair<double, int> total(const std::vector<TraceOp>& ops, const std::string& name) {
  double s = 0;
  int n = 0;
  for (const TraceOp& o : ops)
    if (o.name == name) s += o.end - o.ts, ++n;
  return {s, n};
}

SimulationResult simulate(const ModelSpec& m, const Plan& p, bool steady, bool trace) {
  SimulateOptions o = on_cluster("dgx-a100");
  o.trace = trace;
  o.steady_state = steady;
  return simulated(m, checked(p, m), o);
}

ModelSpec gpt2() {
  auto m = model_preset("gpt2-124m");
  REQUIRE(m.ok());
  return *m;
}

}  // namespace

TEST_CASE("a simulated update off the critical path shortens the steady-state iteration by the ops it moves",
          "[sim_backend][overlap]") {
  // dp 2 on one node's NVLink, a long backward: the reductions and the updates they trigger keep up with it.
  const ModelSpec m = gpt2();
  Plan off;
  off.dp = 2, off.zero = 0, off.micro_batch = 8, off.global_batch = 16, off.seq_len = 1024;
  off.precision = Precision::fp32;  // AdamW updates the values in place: one op per bucket
  off.grad_bucket_mb = 25;
  Plan on = off;
  on.overlap_update = true;
  const RankTrace a = rank0_trace(simulate(m, off, false, true).trace_json);
  const RankTrace b = rank0_trace(simulate(m, on, false, true).trace_json);
  // The simulator clips by default, so every update waits for the norm: the norm's sums of squares,
  // all-reduces and clip coefficient move to the data-parallel stream but stay on the way to the
  // first update. What leaves the critical path: every AdamW but the first bucket's (the next
  // forward's first layer, the embedding, is in it; the updates run in forward order) and the
  // gradient zeroing, which the next step's backward waits for instead.
  double moved = 0;
  for (const char* name : {"adamw", "fill"}) {
    const auto [t_off, n_off] = total(a.compute, name);
    const auto [t_on, n_on] = total(b.compute, name);
    INFO(name << ": " << n_off << " ops (" << t_off << " µs) on the compute stream without, " << n_on << " ("
              << t_on << " µs) with");
    CHECK(n_on < n_off);
    moved += t_off - t_on;
  }
  const auto [adamw, buckets] = total(b.dp, "adamw");
  REQUIRE(buckets > 1);
  const auto first_update =
      std::find_if(b.dp.begin(), b.dp.end(), [](const TraceOp& o) { return o.name == "adamw"; });
  const double first = first_update->end - first_update->ts;
  const SimulationResult steady_off = simulate(m, off, true, true), steady_on = simulate(m, on, true, true);
  const double t_off = steady_off.iteration_s, t_on = steady_on.iteration_s;
  // In the two-iteration traces: does a data-parallel op of the first iteration run while the
  // compute stream works on the second? (Each iteration issues the ops of the one-iteration trace.)
  auto overlaps_next = [](const RankTrace& two, const RankTrace& one) {
    const std::vector<TraceOp> first_dp(two.dp.begin(), two.dp.begin() + static_cast<std::ptrdiff_t>(one.dp.size()));
    for (std::size_t i = one.compute.size(); i < two.compute.size(); ++i)
      for (const TraceOp& d : first_dp)
        if (d.ts < two.compute[i].end && two.compute[i].ts < d.end) return true;
    return false;
  };
  CHECK(overlaps_next(rank0_trace(steady_on.trace_json), b));
  CHECK(!overlaps_next(rank0_trace(steady_off.trace_json), a));
  const double gained_us = (t_off - t_on) * 1e6;
  INFO("steady state: " << t_off * 1e3 << " ms without, " << t_on * 1e3 << " ms with; gained " << gained_us
                        << " µs; moved " << moved << " µs, first bucket's update " << first << " µs");
  CHECK(gained_us > 0);
  CHECK(gained_us == Approx(moved - first).epsilon(0.1));
}

TEST_CASE("simulated ZeRO-3 prefetch across chunks issues the next pass's first gather under the current pass",
          "[sim_backend][overlap][zero3]") {
  // 12 layers on pp 2 × vpp 2: passes of 3 layers, and 4 micro-batches: many pass boundaries.
  const ModelSpec m = gpt2();
  Plan within;
  within.pp = 2, within.vpp = 2, within.dp = 2, within.zero = 3, within.schedule = ScheduleKind::interleaved;
  within.micro_batch = 1, within.global_batch = 8, within.seq_len = 1024;
  within.prefetch_across_chunks = false;
  Plan across = within;
  across.prefetch_across_chunks = true;
  // A gather is exposed when it starts while rank 0's compute stream runs nothing: the pass that
  // needs it waits for all of it.
  auto exposed = [](const RankTrace& t) {
    int n = 0, gathers = 0;
    for (const TraceOp& g : t.dp) {
      if (g.name != "all_gather") continue;
      ++gathers;
      const bool busy = std::any_of(t.compute.begin(), t.compute.end(),
                                    [&](const TraceOp& c) { return c.ts <= g.ts && g.ts < c.end; });
      if (!busy) ++n;
    }
    return std::pair{n, gathers};
  };
  const SimulationResult a = simulate(m, within, false, true), b = simulate(m, across, false, true);
  const auto [exposed_within, gathers_within] = exposed(rank0_trace(a.trace_json));
  const auto [exposed_across, gathers_across] = exposed(rank0_trace(b.trace_json));
  INFO("within a pass: " << exposed_within << " of " << gathers_within << " gathers start on an idle compute stream, "
                         << a.iteration_s * 1e3 << " ms; across: " << exposed_across << " of " << gathers_across
                         << ", " << b.iteration_s * 1e3 << " ms");
  CHECK(exposed_across < exposed_within);
  CHECK(b.iteration_s < a.iteration_s);
}

TEST_CASE("interleaved receives posted ahead (overlap_p2p_comm) leave the compute stream, and their waits stay the "
          "pipeline's",
          "[sim_backend][overlap][pp]") {
  // gpt2-124m on 16 A100s, pp 4 with 3 chunks of one layer each, dp 4: stage 1's neighbours are on
  // another node. Without the overlap every receive is a task of the compute stream; with it each runs on
  // its "pipeline recv" stream, as many of them, and the compute stream only waits for what is still on
  // the wire, which the idle report charges to the pipeline.
  Plan p;
  p.pp = 4, p.vpp = 3, p.dp = 4, p.schedule = ScheduleKind::interleaved, p.global_batch = 32;
  Plan ahead = p;
  ahead.overlap_p2p_comm = true;
  const SimulationResult blocking = simulate(gpt2(), p, false, true), posted = simulate(gpt2(), ahead, false, true);
  const auto before = rank0_streams(blocking.trace_json), after = rank0_streams(posted.trace_json);
  const int received = total(stream_ops(before, "compute"), "recv").second;
  // Rank 0 (stage 0): 8 micro-batches x (2 chunks' activations + 3 chunks' gradients).
  CHECK(received == 8 * (2 + 3));
  CHECK(total(stream_ops(after, "compute"), "recv").second == 0);
  CHECK(total(stream_ops(after, "pipeline recv activations"), "recv").second == 8 * 2);
  CHECK(total(stream_ops(after, "pipeline recv gradients"), "recv").second == 8 * 3);
  CHECK(posted.iteration_s < blocking.iteration_s);
  CHECK(posted.idle.other_s == 0);
  CHECK(posted.idle.pipeline_s > 0);
  // pp 2: a stage's activations and gradients come from the same neighbour, on two streams, and pair
  // with its sends by their order (simulator/executor.h): the run completes, no slower.
  Plan two = p;
  two.pp = 2, two.vpp = 2, two.dp = 8;
  Plan two_ahead = two;
  two_ahead.overlap_p2p_comm = true;
  const SimulationResult blocking2 = simulate(gpt2(), two, false, false);
  const SimulationResult posted2 = simulate(gpt2(), two_ahead, false, true);
  const auto streams2 = rank0_streams(posted2.trace_json);
  CHECK(total(stream_ops(streams2, "pipeline recv activations"), "recv").second == 4 * 1);
  CHECK(total(stream_ops(streams2, "pipeline recv gradients"), "recv").second == 4 * 2);
  CHECK(posted2.iteration_s <= blocking2.iteration_s);
}
