#include "engine/data/data_loader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

using namespace meshtrain;

namespace {
constexpr std::uint64_t kSeed = 1234;

// tokens[i] = i mod 256, so a row's position in the split can be read off its
// values: each id is one more than the previous (mod 256).
std::vector<std::uint8_t> counting_tokens(std::size_t n) {
  std::vector<std::uint8_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint8_t>(i);
  return t;
}

Batch next_ok(DataLoader& l, int batch, int seq) {
  auto b = l.next(batch, seq);
  REQUIRE(b.ok());
  return std::move(b).value();
}
}  // namespace

TEST_CASE("batches are spans of the split with targets shifted by one", "[loader]") {
  INFO("seed " << kSeed);
  const auto tokens = counting_tokens(5000);
  DataLoader loader(tokens, kSeed);
  for (int call = 0; call < 4; ++call) {
    const Batch b = next_ok(loader, 3, 16);
    REQUIRE(b.rows == 3);
    REQUIRE(b.seq == 16);
    REQUIRE(b.ids.size() == 48);
    REQUIRE(b.targets.size() == 48);
    for (int r = 0; r < 3; ++r) {
      const std::uint64_t offset = loader.offset_of(static_cast<std::uint64_t>(call) * 3 + r, 16);
      CHECK(offset + 16 + 1 <= tokens.size());
      for (int t = 0; t < 16; ++t) {
        CHECK(b.ids[r * 16 + t] == tokens[offset + t]);
        CHECK(b.targets[r * 16 + t] == tokens[offset + t + 1]);
      }
    }
  }
  CHECK(loader.state().draws == 12);
}

TEST_CASE("offsets cover the whole split and never run past it", "[loader]") {
  INFO("seed " << kSeed);
  // 10 tokens, T = 8: offsets 0 and 1 are the only ones that fit a target.
  const auto tokens = counting_tokens(10);
  DataLoader loader(tokens, kSeed);
  std::set<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < 200; ++i) seen.insert(loader.offset_of(i, 8));
  CHECK(seen == std::set<std::uint64_t>{0, 1});
  // Exactly one sequence's worth: offset 0 every time.
  const auto one = counting_tokens(9);
  DataLoader one_loader(one, kSeed);
  CHECK(next_ok(one_loader, 4, 8).ids[3 * 8] == 0);

  auto too_long = DataLoader(tokens, kSeed).next(1, 10);
  REQUIRE_FALSE(too_long.ok());
  CHECK_THAT(too_long.error().message(),
             Catch::Contains("has 10 tokens, but one sequence of 10 tokens needs 11"));
  CHECK_FALSE(DataLoader(tokens, kSeed).next(0, 4).ok());
}

TEST_CASE("the same seed gives the same batches, another seed others", "[loader]") {
  INFO("seed " << kSeed);
  const auto tokens = counting_tokens(100000);
  DataLoader a(tokens, kSeed), b(tokens, kSeed), c(tokens, kSeed + 1);
  for (int i = 0; i < 5; ++i) {
    const Batch ba = next_ok(a, 4, 32);
    CHECK(ba.ids == next_ok(b, 4, 32).ids);
    CHECK(ba.ids != next_ok(c, 4, 32).ids);
  }
}

TEST_CASE("a restored state resumes the same sequence of batches", "[loader]") {
  INFO("seed " << kSeed);
  const auto tokens = counting_tokens(100000);
  DataLoader run(tokens, kSeed);
  for (int i = 0; i < 3; ++i) next_ok(run, 4, 32);
  const std::string saved = loader_state_to_json(run.state()).dump();

  auto state = loader_state_from_json(nlohmann::json::parse(saved));
  REQUIRE(state.ok());
  CHECK(*state == run.state());
  DataLoader resumed(tokens, /*seed=*/999);  // the seed comes from the state
  resumed.restore(*state);
  for (int i = 0; i < 3; ++i) {
    const Batch expected = next_ok(run, 4, 32);
    const Batch got = next_ok(resumed, 4, 32);
    CHECK(got.ids == expected.ids);
    CHECK(got.targets == expected.targets);
  }

  CHECK_FALSE(loader_state_from_json(nlohmann::json{{"seed", 1}}).ok());
  CHECK_FALSE(loader_state_from_json(nlohmann::json{{"seed", -1}, {"draws", 0}}).ok());
  CHECK(loader_state_from_json(nlohmann::json{{"seed", 1}, {"draws", 0}}).ok());
}

TEST_CASE("data-parallel ranks split the global batch disjointly and in rank order", "[loader]") {
  INFO("seed " << kSeed);
  const auto tokens = counting_tokens(100000);
  constexpr int kDp = 3, kB = 2, kT = 16;
  DataLoader single(tokens, kSeed);
  std::vector<DataLoader> ranks;
  for (int r = 0; r < kDp; ++r) ranks.emplace_back(tokens, kSeed, r, kDp);
  for (int step = 0; step < 4; ++step) {
    const Batch global = next_ok(single, kB * kDp, kT);
    std::vector<std::int32_t> joined;
    for (int r = 0; r < kDp; ++r) {
      const Batch b = next_ok(ranks[r], kB, kT);
      joined.insert(joined.end(), b.ids.begin(), b.ids.end());
    }
    // Rank r holds rows [r·B, (r+1)·B) of the dp=1 batch: disjoint draws, none skipped.
    CHECK(joined == global.ids);
    for (const auto& r : ranks) CHECK(r.state() == single.state());
  }
}

TEST_CASE("validation batches are the first non-overlapping sequences in order", "[loader]") {
  const auto tokens = counting_tokens(100);
  // (100 - 1) / 10 = 9 sequences fit; ask for up to 7 in batches of 3: 3 + 3 + 1.
  auto v = validation_batches(tokens, 3, 10, 7);
  REQUIRE(v.ok());
  REQUIRE(v->size() == 3);
  CHECK((*v)[0].rows == 3);
  CHECK((*v)[2].rows == 1);
  int k = 0;
  for (const Batch& b : *v) {
    for (int r = 0; r < b.rows; ++r, ++k) {
      CHECK(b.ids[r * 10] == k * 10);
      CHECK(b.targets[r * 10 + 9] == k * 10 + 10);
    }
  }
  CHECK(k == 7);

  auto all = validation_batches(tokens, 4, 10, 1000);
  REQUIRE(all.ok());
  int total = 0;
  for (const Batch& b : *all) total += b.rows;
  CHECK(total == 9);
  CHECK(all->back().targets.back() ==
        90);  // sequence 8 starts at 80; its last target is tokens[90]

  // A split of exactly T + 1 tokens still gives one sequence.
  auto minimal = validation_batches(counting_tokens(11), 8, 10, 50);
  REQUIRE(minimal.ok());
  REQUIRE(minimal->size() == 1);
  CHECK(minimal->front().rows == 1);
  // The same call twice gives the same batches: the val loss is comparable across steps.
  CHECK(validation_batches(tokens, 3, 10, 7)->front().ids == v->front().ids);
}
