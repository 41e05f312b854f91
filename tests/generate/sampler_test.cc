// The sampler (engine/generate/sampler.h): its probabilities on known logits
// for each temperature, top-k and top-p, draws that follow them, the same
// draws for a seed, top-k 1 as greedy, and its options' ranges.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/generate/sampler.h"

using namespace meshtrain;

namespace {

// Logits whose softmax at temperature 1 is exactly `p` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

void check_probabilities(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("token " << i);
    CHECK(got[i] == Approx(want[i]).margin(1e-7));
  }
}

SamplingOptions with(double temperature, int top_k, double top_p, std::uint64_t seed = 0) {
  SamplingOptions o;
  o.temperature = temperature, o.top_k = top_k, o.top_p = top_p, o.seed = seed;
  return o;
}

}  // namespace

TEST_CASE("sampling probabilities on known logits", "[generate][sampler]") {
  const std::vector<float> l = logits_of({0.1, 0.2, 0.3, 0.4});
  SECTION("temperature 1 is the softmax") { check_probabilities(sampling_probabilities(l, with(1, 0, 1)), {.1, .2, .3, .4}); }
  SECTION("temperature 2 takes the square root of the probabilities") {
    const double s = std::sqrt(.1) + std::sqrt(.2) + std::sqrt(.3) + std::sqrt(.4);
    check_probabilities(sampling_probabilities(l, with(2, 0, 1)),
                        {std::sqrt(.1) / s, std::sqrt(.2) / s, std::sqrt(.3) / s, std::sqrt(.4) / s});
  }
  SECTION("temperature 0.5 squares them") {
    const double s = .01 + .04 + .09 + .16;
    check_probabilities(sampling_probabilities(l, with(0.5, 0, 1)), {.01 / s, .04 / s, .09 / s, .16 / s});
  }
  SECTION("temperature 0 is one-hot on the largest logit") {
    check_probabilities(sampling_probabilities(l, with(0, 0, 1)), {0, 0, 0, 1});
  }
  SECTION("top-k keeps the k most probable, renormalised") {
    check_probabilities(sampling_probabilities(l, with(1, 2, 1)), {0, 0, 3. / 7, 4. / 7});
    check_probabilities(sampling_probabilities(l, with(1, 1, 1)), {0, 0, 0, 1});
    check_probabilities(sampling_probabilities(l, with(1, 9, 1)), {.1, .2, .3, .4});
  }
  SECTION("top-p keeps the smallest most-probable set reaching p") {
    check_probabilities(sampling_probabilities(l, with(1, 0, 0.35)), {0, 0, 0, 1});  // .4 >= .35
    check_probabilities(sampling_probabilities(l, with(1, 0, 0.5)), {0, 0, 3. / 7, 4. / 7});  // .4 + .3
    check_probabilities(sampling_probabilities(l, with(1, 0, 0.75)), {0, 2. / 9, 3. / 9, 4. / 9});
    check_probabilities(sampling_probabilities(l, with(1, 0, 1.0)), {.1, .2, .3, .4});
  }
  SECTION("top-p applies to what top-k kept, renormalised") {
    // top-k 3 leaves .2/.9, .3/.9, .4/.9; p 0.7 needs .4/.9 + .3/.9 = .78.
    check_probabilities(sampling_probabilities(l, with(1, 3, 0.7)), {0, 0, 3. / 7, 4. / 7});
  }
  SECTION("ties: the lower id first") {
    const std::vector<float> tied = {1.f, 3.f, 3.f, 0.f};
    check_probabilities(sampling_probabilities(tied, with(0, 0, 1)), {0, 1, 0, 0});
    const std::vector<double> p = sampling_probabilities(tied, with(1, 1, 1));
    CHECK(p[1] == 1.0);
  }
}

TEST_CASE("draws follow the sampling probabilities", "[generate][sampler]") {
  const std::vector<float> l = logits_of({0.1, 0.2, 0.3, 0.4});
  for (const SamplingOptions& o : {with(1, 0, 1, 42), with(2, 0, 1, 43), with(1, 0, 0.75, 44), with(1, 2, 1, 45)}) {
    const Sampler s(o);
    const std::vector<double> p = sampling_probabilities(l, o);
    std::vector<double> seen(4, 0);
    constexpr int kDraws = 40000;
    for (int i = 0; i < kDraws; ++i) seen[static_cast<std::size_t>(*s.next(l, static_cast<std::uint64_t>(i)))] += 1;
    for (std::size_t v = 0; v < 4; ++v) {
      INFO("temperature " << o.temperature << " top-k " << o.top_k << " top-p " << o.top_p << " token " << v);
      // 40000 draws: a standard deviation of at most 0.0025.
      CHECK(seen[v] / kDraws == Approx(p[v]).margin(0.0125));
      if (p[v] == 0) CHECK(seen[v] == 0);
    }
  }
}

TEST_CASE("the same seed draws the same tokens, top-k 1 is greedy", "[generate][sampler]") {
  std::vector<std::vector<float>> rows;
  std::uint32_t x = 7;
  for (int r = 0; r < 200; ++r) {
    std::vector<float> row;
    for (int v = 0; v < 50; ++v) {
      x = x * 1664525u + 1013904223u;
      row.push_back(static_cast<float>(x >> 8) / 16777216.f * 6.f);
    }
    rows.push_back(row);
  }
  auto draws = [&](const SamplingOptions& o) {
    std::vector<std::int32_t> out;
    const Sampler s(o);
    for (std::size_t i = 0; i < rows.size(); ++i) out.push_back(*s.next(rows[i], i));
    return out;
  };
  CHECK(draws(with(1, 0, 0.9, 5)) == draws(with(1, 0, 0.9, 5)));
  CHECK(draws(with(1, 0, 0.9, 5)) != draws(with(1, 0, 0.9, 6)));
  const std::vector<std::int32_t> greedy = draws(with(0, 0, 1, 1));
  CHECK(draws(with(1, 1, 1, 2)) == greedy);
  CHECK(draws(with(3, 1, 0.5, 3)) == greedy);
  for (std::size_t i = 0; i < rows.size(); ++i)
    CHECK(greedy[i] == std::max_element(rows[i].begin(), rows[i].end()) - rows[i].begin());
  // Uniform numbers: in [0, 1), spread over it.
  double sum = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const double u = sampling_uniform(99, i);
    REQUIRE(u >= 0);
    REQUIRE(u < 1);
    sum += u;
  }
  CHECK(sum / 10000 == Approx(0.5).margin(0.01));
}

TEST_CASE("sampling options out of range are refused naming the flag", "[generate][sampler]") {
  auto message = [](const SamplingOptions& o) {
    const Status s = check_sampling(o);
    REQUIRE_FALSE(s.ok());
    return s.error().message();
  };
  CHECK_THAT(message(with(-0.5, 0, 1)), Catch::Contains("--temperature") && Catch::Contains(">= 0"));
  CHECK_THAT(message(with(NAN, 0, 1)), Catch::Contains("--temperature"));
  CHECK_THAT(message(with(1, -1, 1)), Catch::Contains("--top-k"));
  CHECK_THAT(message(with(1, 0, 0)), Catch::Contains("--top-p") && Catch::Contains("(0, 1]"));
  CHECK_THAT(message(with(1, 0, 1.5)), Catch::Contains("--top-p"));
  CHECK(check_sampling(with(0, 0, 1)).ok());
  CHECK(check_sampling(with(0.7, 40, 0.95)).ok());
  const Sampler s(with(1, 0, 1));
  const std::vector<float> bad = {0.f, NAN, 1.f};
  auto r = s.next(bad, 0);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message(), Catch::Contains("non-finite") && Catch::Contains("token 1"));
}
