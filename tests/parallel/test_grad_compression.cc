// Gradient compression (engine/parallel/grad_compression.h) on the cpu
// backend, ranks as threads: the bytes each rank sends per step, counted by
// its communicator; bf16/fp16 runs against the uncompressed run; 1-bit runs
// agree across ranks and repeat bit for bit; plans it cannot serve refused.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/parallel/grad_compression.h"
#include "tests/parallel/compressed_bytes.h"
#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

Plan compressed(Plan p, GradCompression c, int warmup = 0, bool feedback = true) {
  p.grad_compression = c, p.grad_compression_warmup = warmup, p.error_feedback = feedback;
  return p;
}

// Bytes rank 0 sends during each of kSteps training steps (its communicator's count).
std::vector<std::int64_t> bytes_per_step(const ModelSpec& m, const Plan& p) {
  REQUIRE(validate_plan(p, m).ok());
  std::vector<std::int64_t> out;
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm, CpuBackendOptions{1});
    const Mesh mesh(p);
    TrainingEngine engine(b, m, p, step_options());
    const int d = mesh.coord_of(rank).dp, per = p.microbatches();
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<HostBatch> all = global_batch(m, step);
      const std::int64_t before = comm.bytes_sent();
      auto r = engine.step({all.begin() + d * per, all.begin() + (d + 1) * per}, 1e-2f, step);
      if (!r.ok()) return std::move(r).error();
      if (rank == 0) out.push_back(comm.bytes_sent() - before);
    }
    return ok_status();
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
  return out;
}

// The largest relative error of a run's parameters against another's.
double worst_parameter_error(const PlanRun& a, const PlanRun& b) {
  double worst = 0;
  for (const auto& [name, values] : b.ranks[0].state)
    if (name.starts_with("params/")) worst = std::max(worst, relative_error(a.ranks[0].state.at(name), values));
  return worst;
}

}  // namespace

TEST_CASE("compressed gradients: each rank sends the expected fraction of the fp32 bytes per step",
          "[parallel][compression][bytes]") {
  for (int zero : {0, 1}) {
    for (int dp : {2, 4}) {
      Plan p = make_plan(1, 1, dp, zero, ScheduleKind::one_f_one_b);
      p.grad_bucket_mb = 4;  // one bucket per stage
      INFO("seed " << kSeed << ", zero " << zero << ", dp " << dp);
      check_compressed_bytes(p, [](const Plan& q) { return bytes_per_step(tiny_gpt(), q); });
    }
  }
}

TEST_CASE("compressed gradients: the warm-up steps send fp32, the steps after it compressed",
          "[parallel][compression][bytes]") {
  const Plan p = make_plan(1, 1, 2, 0, ScheduleKind::one_f_one_b);
  const std::vector<std::int64_t> plain = bytes_per_step(tiny_gpt(), p);
  const std::vector<std::int64_t> warm = bytes_per_step(tiny_gpt(), compressed(p, GradCompression::one_bit, 2));
  CHECK(warm[0] == plain[0]);
  CHECK(warm[1] == plain[1]);
  CHECK(warm[2] < plain[2] / 20);
}

TEST_CASE("bf16 and fp16 gradient compression stay close to the uncompressed run",
          "[parallel][compression][numerics]") {
  for (int zero : {0, 1, 2, 3}) {
    const Plan p = make_plan(1, 1, 4, zero, ScheduleKind::one_f_one_b);
    const PlanRun plain = run_plan(tiny_gpt(), p);
    for (GradCompression c : {GradCompression::bf16, GradCompression::fp16}) {
      INFO("seed " << kSeed << ", zero " << zero << ", " << grad_compression_name(c));
      const PlanRun run = run_plan(tiny_gpt(), compressed(p, c));
      for (const RankRun& r : run.ranks) CHECK(r.losses == run.ranks[0].losses);
      for (int s = 0; s < kSteps; ++s) {
        CHECK(run.ranks[0].losses[s] == Approx(plain.ranks[0].losses[s]).epsilon(1e-4));
        // bf16 keeps 8 bits of mantissa: the norm of the rounded gradients is within 2^-8.
        CHECK(run.ranks[0].grad_norms[s] == Approx(plain.ranks[0].grad_norms[s]).epsilon(4e-3));
      }
      // In units of the wire format's rounding (2^-8 bf16, 2^-11 fp16), after kSteps AdamW steps
      // whose updates are as large as the initial weights. Measured: bf16 1.2 units; fp16 3.5,
      // because the gradients (~1e-5, divided by G against overflow) sit in fp16's subnormal
      // range, where its precision is absolute (2^-24), which bf16's 8 exponent bits avoid.
      const double worst = worst_parameter_error(run, plain), unit = c == GradCompression::bf16 ? 0x1p-8 : 0x1p-11;
      INFO("worst parameter error " << worst << " = " << worst / unit << " units");
      CHECK(worst < (c == GradCompression::bf16 ? 2 : 5) * unit);
      CHECK(worst > 0);  // the wire really rounded
    }
  }
}

TEST_CASE("1-bit compression: every rank holds the same model, and runs repeat bit for bit",
          "[parallel][compression][determinism]") {
  for (int zero : {0, 1}) {
    std::vector<std::vector<double>> losses;  // with and without error feedback
    for (bool feedback : {true, false}) {
      INFO("seed " << kSeed << ", zero " << zero << ", error feedback " << feedback);
      Plan p = compressed(make_plan(2, 1, 2, zero, ScheduleKind::one_f_one_b), GradCompression::one_bit, 0, feedback);
      const PlanRun a = run_plan(tiny_gpt(), p), b = run_plan(tiny_gpt(), p);
      for (const RankRun& r : a.ranks) CHECK(r.losses == a.ranks[0].losses);
      CHECK(a.ranks[0].losses == b.ranks[0].losses);
      CHECK(a.ranks[0].state == b.ranks[0].state);
      // Compression acts: step 2 onwards differs from the uncompressed run.
      const PlanRun plain = run_plan(tiny_gpt(), make_plan(2, 1, 2, zero, ScheduleKind::one_f_one_b));
      CHECK(a.ranks[0].losses[2] != plain.ranks[0].losses[2]);
      losses.push_back(a.ranks[0].losses);
    }
    // The error carried from step 1 changes step 2's gradients, so step 3's loss.
    CHECK(losses[0][2] != losses[1][2]);
  }
}

TEST_CASE("gradient compression with pipeline and tensor parallelism keeps the ranks in agreement",
          "[parallel][compression]") {
  // The tied embedding's deferred bucket and several chunks per rank go through the same path.
  const Plan p = compressed(make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2), GradCompression::bf16);
  const PlanRun plain = run_plan(tiny_gpt(), make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2));
  const PlanRun run = run_plan(tiny_gpt(), p);
  for (int s = 0; s < kSteps; ++s) CHECK(run.ranks[0].losses[s] == Approx(plain.ranks[0].losses[s]).epsilon(1e-4));
  CHECK(worst_parameter_error(run, plain) < 2 * 0x1p-8);
}

TEST_CASE("gradient compression options are checked, with the fix named", "[parallel][compression][errors]") {
  Plan p = compressed(make_plan(1, 1, 2, 2, ScheduleKind::one_f_one_b), GradCompression::one_bit);
  const Status s = validate_plan(p, tiny_gpt());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("1bit needs zero 0 or 1") && Catch::Contains("--zero 1"));
  Plan once = make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b);
  once.zero_reduce_once = true;
  const Status s1 = validate_plan(once, tiny_gpt());
  REQUIRE_FALSE(s1.ok());
  CHECK_THAT(s1.error().message(), Catch::Contains("needs zero 2 or 3, got zero 1"));
  auto parsed = parse_grad_compression("2bit");
  REQUIRE_FALSE(parsed.ok());
  CHECK_THAT(parsed.error().message(), Catch::Contains("1bit"));
  PlanOverrides o;
  o.grad_compression = "fp16";
  o.grad_compression_warmup = 5;
  o.error_feedback = false;
  auto applied = apply_overrides(Plan{}, o);
  REQUIRE(applied.ok());
  CHECK(applied->grad_compression == GradCompression::fp16);
  CHECK(applied->grad_compression_warmup == 5);
  CHECK_FALSE(applied->error_feedback);
  CHECK(plan_to_json(*applied)["grad_compression"] == "fp16");
}

TEST_CASE("1-bit all-reduce with error feedback transmits the true sum on average, without it a biased one",
          "[parallel][compression][feedback]") {
  // The same gradients every step on 4 ranks (a fixed, skewed vector per rank): with error feedback the
  // mean of the transmitted sums converges to the exact sum (each phase's error stays bounded, so its
  // share of the mean falls as 1/steps); without it, signs times a chunk scale stay biased.
  constexpr int kRanks = 4, kSteps = 200;
  const std::int64_t n = 1000, k = (n + kRanks - 1) / kRanks;
  auto value = [](int rank, std::int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * (1 + (i % 7)) * 1e-3);
  };
  std::vector<double> exact(n, 0.0);
  for (int r = 0; r < kRanks; ++r)
    for (std::int64_t i = 0; i < n; ++i) exact[static_cast<std::size_t>(i)] += value(r, i);
  for (bool feedback : {true, false}) {
    std::vector<double> mean(n, 0.0);
    const Status s = run_ranks(kRanks, [&](int rank, Communicator& comm) -> Status {
      CpuBackend b(comm, CpuBackendOptions{1});
      const Group g{0, {0, 1, 2, 3}};
      CompressedReduction reduction(b, GradCompression::one_bit, feedback, 1);
      reduction.reserve(0, k, kRanks, true);
      std::vector<float> host(n), out(n);
      for (std::int64_t i = 0; i < n; ++i) host[static_cast<std::size_t>(i)] = value(rank, i);
      Tensor grads = b.empty(Shape{n});
      for (int step = 0; step < kSteps; ++step) {
        b.write(grads, host);
        reduction.all_reduce(0, grads, k, g);
        MT_TRY(b.read(grads, out));
        if (rank == 0)
          for (std::int64_t i = 0; i < n; ++i) mean[static_cast<std::size_t>(i)] += out[static_cast<std::size_t>(i)] / kSteps;
      }
      return ok_status();
    });
    REQUIRE(s.ok());
    double err = 0, norm = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      err += (mean[i] - exact[i]) * (mean[i] - exact[i]);
      norm += exact[i] * exact[i];
    }
    const double rel = std::sqrt(err / norm);
    INFO("error feedback " << feedback << ": relative error of the mean " << rel);
    if (feedback) CHECK(rel < 0.05);
    else CHECK(rel > 0.3);
  }
}

TEST_CASE("ZeRO 2/3 reducing once per step match the single-rank run and reduce-scatter once",
          "[parallel][zero2][reduce_once]") {
  auto once = [](Plan p) {
    p.zero_reduce_once = true;
    return p;
  };
  for (int zero : {2, 3}) check_matches_reference(tiny_gpt(), once(make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b)));
  check_matches_reference(tiny_gpt(), once(make_plan(2, 2, 2, 2, ScheduleKind::interleaved, 2)));
  check_matches_reference(tiny_gpt(), once(make_plan(1, 2, 2, 3, ScheduleKind::one_f_one_b)));
  // dp 2 with m = 2 micro-batches per replica: per micro-batch, m reduce-scatters of the gradients plus
  // one all-gather of the parameters, each (G−1)·k fp32 elements per unit; once per step, one of each.
  const Plan p = make_plan(1, 1, 2, 2, ScheduleKind::one_f_one_b);
  REQUIRE(p.microbatches() == 2);
  const std::vector<std::int64_t> per_microbatch = bytes_per_step(tiny_gpt(), p);
  const std::vector<std::int64_t> per_step = bytes_per_step(tiny_gpt(), once(p));
  CHECK(static_cast<double>(per_step[1]) / static_cast<double>(per_microbatch[1]) == Approx(2.0 / 3).margin(0.005));
}
