// The search space: --fix/--allow parsing and its errors, and the number of
// candidates of a small case counted by hand.
#include <catch2/catch.hpp>

#include "engine/planner/candidates.h"
#include "engine/planner/search_space.h"

using namespace meshtrain;
using namespace meshtrain::planner;

namespace {

SearchContext tiny_context(int gpus, int global_batch) {
  SearchContext ctx;
  ctx.model = load_model("tiny").value();
  ctx.gpus = gpus;
  ctx.gpus_per_node = 8;
  ctx.base.global_batch = global_batch;
  return ctx;
}

std::string error_of(const std::vector<std::string>& fix, const std::vector<std::string>& allow, int gpus = 8) {
  auto r = parse_search_space(fix, allow, tiny_context(gpus, 16));
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

}  // namespace

TEST_CASE("tiny on 4 GPUs with global batch 8 has the hand-counted 78 valid plans of 84 combinations") {
  // tiny: 4 layers, 4 heads, seq 64. recompute fixed to none; counted per (tp, pp, dp):
  //   tp1 pp1 dp4: mb {1,2} x zero {0..3}                                     8
  //   tp1 pp2 dp2: 1f1b mb {1,2,4} x zero 4 = 12; interleaved vpp 2 needs
  //                8/(mb·2) micro-batches even: mb {1,2} x 4 = 8            20
  //   tp1 pp4 dp1: mb {1,2,4,8} (zero 0 only; 4 layers: no vpp, no uneven)   4
  //   tp2 pp1 dp2: mb {1,2,4} x zero 4 x sp {off,on}                         24
  //   tp2 pp2 dp1: 1f1b mb {1,2,4,8} x sp 2 = 8; interleaved mb {1,2,4} x 2 = 6   14
  //   tp4 pp1 dp1: mb {1,2,4,8} x sp 2                                        8
  // = 78 valid; the interleaved ones with an odd micro-batch count (tp1 pp2
  // mb 4: 4 ZeRO stages; tp2 pp2 mb 8: 2 sp) are formed and rejected: 84.
  const SearchContext ctx = tiny_context(4, 8);
  auto space = parse_search_space({"recompute=none"}, {}, ctx);
  REQUIRE(space.ok());
  const Enumeration e = enumerate_candidates(ctx, *space);
  CHECK(e.valid.size() == 78);
  CHECK(e.combinations == 84);
  for (const Plan& p : e.valid) {
    CHECK(p.world_size() == 4);
    CHECK(p.recompute == Recompute::none);
    CHECK(validate_plan(p, ctx.model, 4).ok());
  }
}

TEST_CASE("allowed values widen and narrow a dimension, and derived dp only narrows") {
  const SearchContext ctx = tiny_context(4, 8);
  auto wide = parse_search_space({"recompute=none"}, {"tp=1,2,4,8", "zero=0"}, ctx);
  REQUIRE(wide.ok());
  const Enumeration e = enumerate_candidates(ctx, *wide);
  for (const Plan& p : e.valid) CHECK(p.zero == 0);
  // tp 8 is formed (the list replaces the default) but 8 ranks do not make 4 GPUs.
  auto dp = parse_search_space({}, {"dp=2"}, ctx);
  REQUIRE(dp.ok());
  for (const Plan& p : enumerate_candidates(ctx, *dp).valid) CHECK(p.dp == 2);
}

TEST_CASE("fix and allow errors name the item and the fix") {
  CHECK_THAT(error_of({"tpp=2"}, {}), Catch::Contains("unknown plan dimension 'tpp'") &&
                                          Catch::Contains("did you mean 'tp'"));
  CHECK_THAT(error_of({"tp=x"}, {}), Catch::Contains("--fix 'tp=x': tp value 'x'"));
  CHECK_THAT(error_of({"recompute=some"}, {}), Catch::Contains("recompute value 'some'"));
  CHECK_THAT(error_of({"tp=2,4"}, {}), Catch::Contains("pins one value") && Catch::Contains("--allow tp=2,4"));
  CHECK_THAT(error_of({"tp=2", "tp=4"}, {}), Catch::Contains("--fix tp=2 and --fix tp=4 contradict"));
  CHECK_THAT(error_of({"zero=3"}, {"zero=0,1"}), Catch::Contains("--fix zero=3 is outside --allow's list for zero (0,1)"));
  CHECK_THAT(error_of({"tp=4,pp=4"}, {}), Catch::Contains("--fix tp=4 and --fix pp=4 needs a multiple of 16 GPUs") &&
                                              Catch::Contains("--gpus is 8"));
  CHECK_THAT(error_of({"tp=2,pp=2,dp=1"}, {}), Catch::Contains("make tp·pp·dp = 4 ranks, but --gpus is 8"));
  CHECK_THAT(error_of({"=2"}, {}), Catch::Contains("unknown plan dimension ''"));
  CHECK_THAT(error_of({"2"}, {}), Catch::Contains("'2' has no dimension"));
  CHECK_THAT(error_of({}, {"tp=1,,2"}), Catch::Contains("an empty item"));
  // A repeated, agreeing --fix is fine.
  CHECK(parse_search_space({"tp=2", "tp=2"}, {}, tiny_context(8, 16)).ok());
}

TEST_CASE("every dimension's values print and parse back") {
  for (const Dimension& d : dimensions()) {
    const SearchContext ctx = tiny_context(8, 16);
    for (int v : d.defaults(ctx, ctx.base)) {
      auto back = d.parse(d.format(v));
      REQUIRE(back.ok());
      CHECK(*back == v);
    }
  }
}
