// The search space: --fix/--allow parsing and its errors, and the number of
// candidates of a small case counted by hand.
#include <catch2/catch.hpp>

#include <map>

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
  // The dimensions that double a plan (offload, zero_reduce_once) are pinned
  // off; cp (seq 64), compression and prefetch take one value by default and
  // overlap_update is on in every plan.
  const SearchContext ctx = tiny_context(4, 8);
  auto space = parse_search_space({"recompute=none,offload=none,zero_reduce_once=off"}, {}, ctx);
  REQUIRE(space.ok());
  const Enumeration e = enumerate_candidates(ctx, *space);
  CHECK(e.valid.size() == 78);
  CHECK(e.combinations == 84);
  for (const Plan& p : e.valid) {
    CHECK(p.world_size() == 4);
    CHECK(p.recompute == Recompute::none);
    CHECK((p.cp == 1 && p.overlap_update && p.grad_compression == GradCompression::none));
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
  // A list of named values is printed as --allow spells them, not as their numbers.
  CHECK_THAT(error_of({"recompute=full"}, {"recompute=none,selective"}),
             Catch::Contains("outside --allow's list for recompute (none,selective)"));
  CHECK_THAT(error_of({"tp=4,pp=4"}, {}), Catch::Contains("--fix tp=4 and --fix pp=4 needs a multiple of 16 GPUs") &&
                                              Catch::Contains("--gpus is 8"));
  CHECK_THAT(error_of({"tp=2,pp=2,dp=1"}, {}), Catch::Contains("make tp·pp·dp = 4 ranks, but --gpus is 8"));
  CHECK_THAT(error_of({"=2"}, {}), Catch::Contains("unknown plan dimension ''"));
  CHECK_THAT(error_of({"2"}, {}), Catch::Contains("'2' has no dimension"));
  CHECK_THAT(error_of({}, {"tp=1,,2"}), Catch::Contains("an empty item"));
  // Pins of the later dimensions the engine does not combine, named with why.
  CHECK_THAT(error_of({"offload=params,zero=1"}, {}),
             Catch::Contains("--fix offload=params and --fix zero=1 contradict") && Catch::Contains("needs zero 3"));
  CHECK_THAT(error_of({"zero_reduce_once=on", "zero=0"}, {}),
             Catch::Contains("--fix zero_reduce_once=on and --fix zero=0 contradict"));
  CHECK_THAT(error_of({"grad_compression=1bit,zero=2"}, {}),
             Catch::Contains("--fix grad_compression=1bit and --fix zero=2 contradict"));
  CHECK_THAT(error_of({"overlap_update=on,offload=optimizer"}, {}),
             Catch::Contains("--fix overlap_update=on and --fix offload=optimizer contradict"));
  CHECK_THAT(error_of({"cp_comm=ring,cp=1"}, {}), Catch::Contains("--fix cp_comm=ring and --fix cp=1 contradict"));
  CHECK_THAT(error_of({"tp=4,cp=4"}, {}), Catch::Contains("--fix tp=4 and --fix cp=4 needs a multiple of 16 GPUs"));
  CHECK_THAT(error_of({"tp=2,cp=2,pp=1,dp=1"}, {}), Catch::Contains("make tp·cp·pp·dp = 4 ranks, but --gpus is 8"));
  CHECK_THAT(error_of({"offload=disk"}, {}), Catch::Contains("offload value 'disk'"));
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

TEST_CASE("context parallelism is searched where every rank keeps 4096 tokens, its exchange only with cp > 1") {
  SearchContext ctx;
  ctx.model = load_model("llama3-70b").value();
  ctx.gpus = 512;
  ctx.base.global_batch = 64;
  ctx.base.seq_len = 32768;
  const std::size_t cp = static_cast<std::size_t>(find_dimension("cp").value() - dimensions().data());
  const std::size_t comm = static_cast<std::size_t>(find_dimension("cp_comm").value() - dimensions().data());
  const SearchSpace defaults;
  Plan partial = ctx.base;
  partial.tp = 8;
  // 32768 / 8 = 4096 tokens a rank; cp 16 would leave 2048.
  CHECK(defaults.values(cp, ctx, partial) == std::vector<int>{1, 2, 4, 8});
  ctx.base.seq_len = 8192;
  CHECK(defaults.values(cp, ctx, partial) == std::vector<int>{1, 2});
  ctx.base.seq_len = 4096;  // the model's own: no context parallelism
  CHECK(defaults.values(cp, ctx, partial) == std::vector<int>{1});
  // gpt2 (learned positions up to 1024) and MoE or vision models never split by default.
  for (const char* model : {"gpt2-124m", "vit-b16"}) {
    SearchContext other = ctx;
    other.model = load_model(model).value();
    other.base.seq_len = 0;
    CHECK(defaults.values(cp, other, partial) == std::vector<int>{1});
  }
  // The exchange: both kinds with cp > 1; with cp 1 the base's, whatever --allow lists.
  auto both = parse_search_space({}, {"cp_comm=allgather,ring"}, ctx);
  REQUIRE(both.ok());
  partial.cp = 2;
  CHECK(both->values(comm, ctx, partial).size() == 2);
  partial.cp = 1;
  CHECK(both->values(comm, ctx, partial) == std::vector<int>{static_cast<int>(ContextComm::all_gather)});

  // A pin reaches every candidate: tiny's 64 tokens split over 2 context ranks of 4 GPUs.
  const SearchContext tiny = tiny_context(4, 8);
  auto pinned = parse_search_space({"cp=2"}, {}, tiny);
  REQUIRE(pinned.ok());
  const Enumeration e = enumerate_candidates(tiny, *pinned);
  REQUIRE_FALSE(e.valid.empty());
  int ring = 0;
  for (const Plan& p : e.valid) {
    CHECK(p.cp == 2);
    CHECK(p.tp * p.pp * p.dp == 2);
    ring += p.cp_comm == ContextComm::ring ? 1 : 0;
  }
  CHECK(ring * 2 == static_cast<int>(e.valid.size()));
}

TEST_CASE("gradient compression is searched only when allowed, and only where gradients are reduced") {
  const SearchContext ctx = tiny_context(4, 8);
  auto plain = parse_search_space({"recompute=none"}, {}, ctx);
  REQUIRE(plain.ok());
  for (const Plan& p : enumerate_candidates(ctx, *plain).valid) CHECK(p.grad_compression == GradCompression::none);
  auto allowed = parse_search_space({"recompute=none,offload=none"}, {"grad_compression=none,bf16,1bit"}, ctx);
  REQUIRE(allowed.ok());
  std::map<std::string, int> kinds;
  for (const Plan& p : enumerate_candidates(ctx, *allowed).valid) {
    if (p.dp == 1) CHECK(p.grad_compression == GradCompression::none);
    // validate_plan: 1bit under ZeRO 0 and 1 only.
    if (p.zero >= 2) CHECK(p.grad_compression != GradCompression::one_bit);
    ++kinds[grad_compression_name(p.grad_compression)];
  }
  CHECK(kinds.size() == 3);
  CHECK(kinds["bf16"] > kinds["1bit"]);
}

TEST_CASE("pins the pipeline and FP8 switches cannot take are refused up front, naming both", "[planner]") {
  const SearchContext ctx = tiny_context(8, 16);
  auto contradiction = [&](const std::string& fix) {
    auto r = parse_search_space({fix}, {}, ctx);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(contradiction("overlap_p2p_comm=on,schedule=1f1b"),
             Catch::Contains("--fix overlap_p2p_comm=on and --fix schedule=1f1b contradict") &&
                 Catch::Contains("needs schedule interleaved"));
  CHECK_THAT(contradiction("overlap_p2p_comm=on,pp=1"), Catch::Contains("needs pp > 1"));
  CHECK_THAT(contradiction("fp8_param_gather=on,zero=0"), Catch::Contains("needs zero 1, 2 or 3"));
  CHECK(parse_search_space({"overlap_p2p_comm=off,schedule=1f1b"}, {}, ctx).ok());
}

TEST_CASE("bf16 gradients refuse a search over gradient compression up front", "[planner]") {
  SearchContext ctx = tiny_context(8, 16);
  ctx.base.grad_dtype = GradDtype::bf16;
  auto refused = parse_search_space({}, {"grad_compression=none,bf16"}, ctx);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message(), Catch::Contains("--grad-dtype bf16 does not combine with gradient compression") &&
                                            Catch::Contains("--grad-dtype fp32"));
  CHECK(parse_search_space({}, {"grad_compression=none"}, ctx).ok());
  CHECK(parse_search_space({}, {}, ctx).ok());
}

TEST_CASE("recompute modules are searched only when allowed, on models with experts, not under full recomputation",
          "[planner]") {
  SearchContext ctx = tiny_context(4, 8);
  ctx.model = load_model("tiny-moe").value();
  // By default every candidate keeps the base plan's modules (none here).
  auto plain = parse_search_space({"offload=none"}, {}, ctx);
  REQUIRE(plain.ok());
  for (const Plan& p : enumerate_candidates(ctx, *plain).valid) CHECK_FALSE(p.recompute_modules.any());
  // Allowed, each set is searched where no whole layer is recomputed; full recomputation keeps none.
  auto allowed = parse_search_space({"offload=none"}, {"recompute_modules=none,moe_act,layernorm+moe_act"}, ctx);
  REQUIRE(allowed.ok());
  std::map<std::string, int> sets;
  for (const Plan& p : enumerate_candidates(ctx, *allowed).valid) {
    if (p.recompute == Recompute::full) CHECK_FALSE(p.recompute_modules.any());
    else ++sets[recompute_label(p)];
  }
  CHECK(sets.size() == 3);
  CHECK(sets["none+moe_act"] == sets["none"]);
  CHECK(sets["none+layernorm,moe_act"] == sets["none"]);
  // The values' text: '+' joins modules, as ',' separates --allow's values.
  const Dimension& d = *find_dimension("recompute_modules").value();
  CHECK(d.format(d.parse("layernorm+moe_act").value()) == "layernorm+moe_act");
  CHECK(d.format(d.parse("none").value()) == "none");
  CHECK_THAT(d.parse("core_attn").error().message(), Catch::Contains("--recompute selective"));
}
