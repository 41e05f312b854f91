// What the FP8 plan tests (test_parallel_fp8.cc, test_parallel_fp8_current.cc)
// share: the step options of the exact emulation, and the check of a plan's
// run against its single-rank run within FP8 rounding's amplification of the
// fp32 plans' last-bit differences (each file states its tolerances' why).
#pragma once

#include <catch2/catch.hpp>

#include "tests/parallel/parallel_check.h"

namespace meshtrain::testing {

inline StepOptions fp8_options() {
  StepOptions o = step_options();
  o.emulate_fp8 = true;
  return o;
}

// Relative tolerances: step 1's loss and gradient norm, the later steps'.
struct Fp8Tolerance {
  double first_loss = 0, first_norm = 0, later_loss = 0, later_norm = 0;
};

// Runs `p`: every rank reports the same loss and norm bits, and rank 0's are
// `ref`'s within `tol`. Rank 0's run, for the caller's further checks.
inline RankRun check_fp8_run(const ModelSpec& m, const Plan& p, const RankRun& ref, const Fp8Tolerance& tol) {
  const PlanRun run = run_plan(m, p, 0, fp8_options());
  for (const RankRun& r : run.ranks) {
    CHECK(r.losses == run.ranks[0].losses);
    CHECK(r.grad_norms == run.ranks[0].grad_norms);
  }
  const RankRun& got = run.ranks[0];
  CHECK(got.losses[0] == Approx(ref.losses[0]).epsilon(tol.first_loss));
  CHECK(got.grad_norms[0] == Approx(ref.grad_norms[0]).epsilon(tol.first_norm));
  for (int s = 1; s < kSteps; ++s) {
    INFO("step " << s + 1);
    CHECK(got.losses[s] == Approx(ref.losses[s]).epsilon(tol.later_loss));
    CHECK(got.grad_norms[s] == Approx(ref.grad_norms[s]).epsilon(tol.later_norm));
  }
  return got;
}

}  // namespace meshtrain::testing
