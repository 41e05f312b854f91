#include "engine/lr_schedule.h"

#include <catch2/catch.hpp>

using namespace meshtrain;

TEST_CASE("warm-up is linear from lr/warmup at step 1 to lr at step warmup", "[lr]") {
  const LrSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .total = 110};
  REQUIRE(validate_lr_schedule(s).ok());
  CHECK(lr_at(s, 1) == Approx(1e-4));
  CHECK(lr_at(s, 5) == Approx(5e-4));
  CHECK(lr_at(s, 10) == Approx(1e-3));
}

TEST_CASE("cosine decay reaches min_lr at total and stays there", "[lr]") {
  const LrSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .total = 110};
  // Halfway (step 60 = 10 + 100/2): cos(π/2) = 0, so the mean of lr and min_lr.
  CHECK(lr_at(s, 60) == Approx(5.5e-4));
  // A quarter (step 35): 1e-4 + 9e-4 · ½ · (1 + cos(π/4)) = 1e-4 + 9e-4 · 0.853553390593.
  CHECK(lr_at(s, 35) == Approx(8.68198051533e-4));
  // Step 11, the first decayed step: progress 1/100, ½(1 + cos(0.01π)) = 0.99975328.
  CHECK(lr_at(s, 11) == Approx(1e-4 + 9e-4 * 0.99975328018));
  CHECK(lr_at(s, 11) < lr_at(s, 10));
  CHECK(lr_at(s, 110) == 1e-4);
  CHECK(lr_at(s, 500) == 1e-4);
}

TEST_CASE("no warm-up starts on the cosine; warm-up over all steps never decays", "[lr]") {
  const LrSchedule none{.lr = 2.0, .min_lr = 0.0, .warmup = 0, .total = 4};
  // Steps 1..4: ½(1 + cos(kπ/4)) · 2 = 1 + cos(kπ/4).
  CHECK(lr_at(none, 1) == Approx(1.70710678119));
  CHECK(lr_at(none, 2) == Approx(1.0));
  CHECK(lr_at(none, 3) == Approx(0.29289321881));
  CHECK(lr_at(none, 4) == 0.0);

  const LrSchedule all{.lr = 1.0, .min_lr = 0.0, .warmup = 4, .total = 4};
  CHECK(lr_at(all, 1) == Approx(0.25));
  CHECK(lr_at(all, 4) == Approx(1.0));
}

TEST_CASE("inconsistent schedules are rejected", "[lr]") {
  auto reject = [](LrSchedule s) {
    auto st = validate_lr_schedule(s);
    REQUIRE_FALSE(st.ok());
    return st.error().message();
  };
  CHECK_THAT(reject({.lr = 1e-4, .min_lr = 1e-3, .warmup = 0, .total = 10}),
             Catch::Contains("min lr 0.001 is above --lr 0.0001"));
  CHECK_THAT(reject({.lr = 1e-3, .min_lr = 0, .warmup = 20, .total = 10}),
             Catch::Contains("warm-up of 20 steps"));
  CHECK_THAT(reject({.lr = -1, .min_lr = 0, .warmup = 0, .total = 10}),
             Catch::Contains("non-negative"));
  CHECK_THAT(reject({.lr = 1, .min_lr = 0, .warmup = 0, .total = 0}),
             Catch::Contains("at least one step"));
}
