#include "engine/training/lr_schedule.h"

#include <catch2/catch.hpp>

#include <cmath>

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

TEST_CASE("no warm-up starts on the cosine, warm-up over all steps never decays", "[lr]") {
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

// The decay shapes after the warm-up, at hand-computed steps (lr 1, min_lr 0.1,
// warm-up 10 of 110 steps, so 100 steps of decay unless --decay-steps says less).
TEST_CASE("linear decay falls in a straight line to min_lr, over --decay-steps when given", "[lr]") {
  const LrSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110, .decay = LrDecay::linear};
  REQUIRE(validate_lr_schedule(s).ok());
  CHECK(lr_at(s, 10) == Approx(1.0));
  CHECK(lr_at(s, 35) == Approx(1.0 - 0.9 * 0.25));  // a quarter of the way
  CHECK(lr_at(s, 60) == Approx(0.55));
  CHECK(lr_at(s, 110) == Approx(0.1));
  LrSchedule short_decay = s;
  short_decay.decay_steps = 40;  // reaches min_lr at step 50, then stays
  CHECK(lr_at(short_decay, 30) == Approx(0.55));
  CHECK(lr_at(short_decay, 50) == Approx(0.1));
  CHECK(lr_at(short_decay, 90) == Approx(0.1));
  LrSchedule short_cosine = short_decay;
  short_cosine.decay = LrDecay::cosine;
  CHECK(lr_at(short_cosine, 30) == Approx(0.55));  // halfway: cos(π/2) = 0
  CHECK(lr_at(short_cosine, 20) == Approx(0.1 + 0.9 * 0.5 * (1 + std::sqrt(0.5))));
}

TEST_CASE("constant holds lr after the warm-up, wsd holds it, then decays over the last steps", "[lr]") {
  const LrSchedule c{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110, .decay = LrDecay::constant};
  CHECK(lr_at(c, 5) == Approx(0.5));
  CHECK(lr_at(c, 11) == 1.0);
  CHECK(lr_at(c, 110) == 1.0);
  // wsd's default cool-down: ceil(100 / 5) = 20 steps, from step 90 to 110.
  const LrSchedule w{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110, .decay = LrDecay::wsd};
  CHECK(decay_steps(w) == 20);
  CHECK(lr_at(w, 5) == Approx(0.5));
  CHECK(lr_at(w, 50) == 1.0);
  CHECK(lr_at(w, 90) == 1.0);
  CHECK(lr_at(w, 91) == Approx(1.0 - 0.9 / 20));
  CHECK(lr_at(w, 100) == Approx(0.55));
  CHECK(lr_at(w, 110) == Approx(0.1));
  LrSchedule w10 = w;
  w10.decay_steps = 10;
  CHECK(lr_at(w10, 100) == 1.0);
  CHECK(lr_at(w10, 105) == Approx(0.55));
}

TEST_CASE("decay steps past the steps after the warm-up are refused, decay names parse", "[lr]") {
  const LrSchedule s{.lr = 1, .min_lr = 0, .warmup = 10, .total = 110, .decay = LrDecay::wsd, .decay_steps = 101};
  const Status st = validate_lr_schedule(s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message(), Catch::Contains("--decay-steps 101 must be between 0") &&
                                       Catch::Contains("100 steps after the 10-step warm-up"));
  for (LrDecay d : {LrDecay::cosine, LrDecay::linear, LrDecay::constant, LrDecay::wsd})
    CHECK(parse_lr_decay(lr_decay_name(d)).value() == d);
  const auto bad = parse_lr_decay("cosin");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("did you mean 'cosine'"));
}
