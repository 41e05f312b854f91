#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/plan/plan.h"
#include "tests/training/error_of.h"

using namespace meshtrain;
using testing::error_of;

namespace {
ModelSpec tiny() { return *model_preset("tiny"); }

std::string rejection(const Plan& p, const ModelSpec& m, int world = 0) {
  auto s = validate_plan(p, m, world);
  REQUIRE_FALSE(s.ok());
  return s.error().message();
}
}  // namespace

TEST_CASE("a valid hybrid plan passes", "[plan]") {
  Plan p;
  p.tp = 2, p.pp = 2, p.dp = 2, p.zero = 1, p.global_batch = 8;
  CHECK(validate_plan(p, tiny(), 8).ok());
  CHECK(p.microbatches() == 4);
}

TEST_CASE("plans that do not divide are rejected naming the numbers", "[plan]") {
  ModelSpec m = tiny();
  Plan p;
  p.tp = 2, p.pp = 2, p.dp = 2;
  CHECK_THAT(rejection(p, m, 12), Catch::Contains("world size 12 != tp·pp·dp·cp = 2·2·2·1 = 8; set dp = 3"));
  // A world that tp·pp·cp does not divide has no dp to suggest.
  CHECK_THAT(rejection(p, m, 6), Catch::Contains("world size 6 is not a multiple of tp·pp·cp = 2·2·1 = 4"));

  Plan tp3;
  tp3.tp = 3;
  CHECK_THAT(rejection(tp3, m), Catch::Contains("heads 4 are not divisible by tp 3"));

  ModelSpec odd_ffn = m;
  odd_ffn.ffn = 250;
  Plan tp4;
  tp4.tp = 4;
  odd_ffn.heads = odd_ffn.kv_heads = 4;
  CHECK_THAT(rejection(tp4, odd_ffn), Catch::Contains("ffn width 250 is not divisible by tp 4"));

  Plan pp3;
  pp3.pp = 3;
  CHECK_THAT(rejection(pp3, m), Catch::Contains("layers 4 are not divisible by pp·vpp = 3·1 = 3"));

  Plan batch;
  batch.dp = 2, batch.micro_batch = 2, batch.global_batch = 6;
  CHECK_THAT(rejection(batch, m), Catch::Contains("global batch 6 is not divisible by micro_batch·dp = 2·2 = 4"));

  Plan zero;
  zero.zero = 4;
  CHECK_THAT(rejection(zero, m), Catch::Contains("zero stage must be 0, 1, 2 or 3, got 4"));

  Plan negative;
  negative.dp = 0;
  CHECK_THAT(rejection(negative, m), Catch::Contains("dp must be positive, got 0"));
}

TEST_CASE("interleaving needs chunks and a multiple of pp micro-batches", "[plan]") {
  ModelSpec m = tiny();
  Plan p;
  p.pp = 2, p.schedule = ScheduleKind::interleaved, p.global_batch = 4;
  CHECK_THAT(rejection(p, m), Catch::Contains("needs vpp >= 2"));
  p.vpp = 2, p.global_batch = 3;
  CHECK_THAT(rejection(p, m), Catch::Contains("micro-batches (3 = global batch 3") && Catch::Contains("multiple of pp 2"));
  p.global_batch = 4;
  CHECK(validate_plan(p, m).ok());
  Plan chunks_without_interleaving;
  chunks_without_interleaving.pp = 2, chunks_without_interleaving.vpp = 2;
  CHECK_THAT(rejection(chunks_without_interleaving, m), Catch::Contains("vpp 2 needs the interleaved schedule"));
}

TEST_CASE("experts must divide by ep and ep by dp", "[plan]") {
  ModelSpec m = tiny();
  m.experts = 6, m.top_k = 2;
  Plan p;
  p.dp = 4, p.ep = 4;
  CHECK_THAT(rejection(p, m), Catch::Contains("experts 6 are not divisible by ep 4"));
  p.ep = 3, p.dp = 2;
  CHECK_THAT(rejection(p, m), Catch::Contains("ep 3 must divide dp 2"));
  p.ep = 2;
  CHECK(validate_plan(p, m).ok());
  Plan dense;
  dense.ep = 2, dense.dp = 2;
  CHECK_THAT(rejection(dense, tiny()), Catch::Contains("dense model"));
}

TEST_CASE("expert parallelism that does not fit is refused naming the numbers", "[plan][moe]") {
  ModelSpec m = *model_preset("tiny-moe");  // 8 experts of width 128, top 2
  Plan p;
  p.tp = 2, p.dp = 4, p.ep = 2;
  CHECK(validate_plan(p, m).ok());
  p.ep = 8;  // more expert ranks than data-parallel ones: not enough ranks
  CHECK_THAT(rejection(p, m), Catch::Contains("ep 8 must divide dp 4") && Catch::Contains("8 ranks"));
  p.ep = 3;
  CHECK_THAT(rejection(p, m), Catch::Contains("experts 8 are not divisible by ep 3"));
  p.ep = 2, p.etp = 4;
  CHECK_THAT(rejection(p, m), Catch::Contains("etp 4 must be 1 (whole experts) or tp 2"));
  // etp 1: the expert groups take tp and dp ranks, so ep may reach tp·dp.
  p.etp = 1, p.ep = 8;
  CHECK(validate_plan(p, m).ok());
  p.dp = 2;
  CHECK_THAT(rejection(p, m), Catch::Contains("ep 8 must divide tp·dp = 2·2 = 4"));
  // The world must hold the plan: 2 GPUs for tp 2 dp 2.
  p.ep = 2;
  CHECK_THAT(validate_plan(p, m, 2).error().message(), Catch::Contains("world size 2 != tp·pp·dp·cp"));
  ModelSpec odd = m;
  odd.ffn = 127;
  odd.dense_ffn = 128;
  p.etp = 0;
  CHECK_THAT(rejection(p, odd), Catch::Contains("expert ffn width 127 is not divisible by etp 2"));
}

TEST_CASE("unknown names suggest the nearest valid one", "[plan]") {
  CHECK_THAT(error_of(parse_schedule("1f1f")), Catch::Contains("did you mean '1f1b'"));
  CHECK_THAT(error_of(parse_recompute("ful")), Catch::Contains("did you mean 'full'"));
  CHECK_THAT(error_of(plan_overrides_from_json({{"tpp", 2}})), Catch::Contains("did you mean 'tp'"));
}

TEST_CASE("flags override the plan file field by field", "[plan]") {
  auto file = plan_overrides_from_json({{"tp", 2}, {"pp", 2}, {"schedule", "gpipe"}, {"zero", 1}});
  REQUIRE(file.ok());
  auto from_file = apply_overrides(Plan{}, *file);
  REQUIRE(from_file.ok());
  PlanOverrides flags;
  flags.pp = 4;
  flags.schedule = "1f1b";
  auto merged = apply_overrides(*from_file, flags);
  REQUIRE(merged.ok());
  CHECK(merged->tp == 2);
  CHECK(merged->pp == 4);
  CHECK(merged->zero == 1);
  CHECK(merged->schedule == ScheduleKind::one_f_one_b);

  CHECK_THAT(error_of(plan_overrides_from_json({{"tp", "two"}})), Catch::Contains("'tp' must be an integer"));
}

TEST_CASE("micro-batches per pipeline set the global batch", "[plan]") {
  PlanOverrides o;
  o.tp = 2, o.pp = 2, o.dp = 2, o.micro_batch = 2, o.microbatches = 8;
  auto p = apply_overrides(Plan{}, o);
  REQUIRE(p.ok());
  CHECK(p->effective_global_batch() == 2 * 2 * 8);
  CHECK(p->microbatches() == 8);
  o.global_batch = 16;
  CHECK_THAT(error_of(apply_overrides(Plan{}, o)), Catch::Contains("global batch 16 and 8 micro-batches disagree"));
  auto from_json = plan_overrides_from_json({{"microbatches", 4}, {"dp", 2}});
  REQUIRE(from_json.ok());
  CHECK(apply_overrides(Plan{}, *from_json)->effective_global_batch() == 8);
  o.global_batch.reset();
  o.microbatches = 0;
  CHECK_FALSE(apply_overrides(Plan{}, o).ok());
}

TEST_CASE("the gradient bucket size and sync mode are plan fields with checked values", "[plan]") {
  CHECK(Plan{}.grad_bucket_mb == 4);  // the engine's bucket from before it was a plan field
  CHECK(Plan{}.grad_sync == GradSync::overlap);
  CHECK_FALSE(plan_to_json(Plan{}).contains("grad_bucket_mb"));  // old plans and checkpoints read the same
  CHECK_FALSE(plan_to_json(Plan{}).contains("grad_sync"));

  auto file = plan_overrides_from_json({{"grad_bucket_mb", 25}, {"grad_sync", "after-backward"}, {"dp", 2}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->grad_bucket_mb == 25);
  CHECK(p->grad_sync == GradSync::after_backward);
  CHECK(validate_plan(*p, tiny()).ok());
  CHECK(plan_to_json(*p)["grad_bucket_mb"] == 25);
  CHECK(plan_to_json(*p)["grad_sync"] == "after-backward");
  PlanOverrides flags;
  flags.grad_bucket_mb = 0.5;
  CHECK(apply_overrides(*p, flags)->grad_bucket_mb == 0.5);

  CHECK_THAT(error_of(plan_overrides_from_json({{"grad_bucket_mb", "25MB"}})),
                   Catch::Contains("'grad_bucket_mb' must be a number in (0, 1048576]"));
  auto bad_mode = plan_overrides_from_json({{"grad_sync", "after_backward"}});
  REQUIRE(bad_mode.ok());
  CHECK_THAT(error_of(apply_overrides(Plan{}, *bad_mode)), Catch::Contains("did you mean 'after-backward'"));

  for (double mb : {0.0, -1.0, 2e6}) {
    Plan bad;
    bad.grad_bucket_mb = mb;
    const std::string msg = rejection(bad, tiny());
    CHECK_THAT(msg, Catch::Contains("grad_bucket_mb (--grad-bucket-mb) must be a positive number of MiB"));
    CHECK_THAT(msg, Catch::Contains("use e.g. 25"));
  }
  Plan zero2;
  zero2.dp = 2, zero2.zero = 2, zero2.grad_sync = GradSync::after_backward;
  CHECK_THAT(rejection(zero2, tiny()), Catch::Contains("after-backward needs zero 0 or 1, got zero 2"));
  zero2.zero = 1;
  CHECK(validate_plan(zero2, tiny()).ok());
}

TEST_CASE("the gradient dtype is a plan field: fp32 by default, bf16 with a 16-bit precision", "[plan]") {
  CHECK(Plan{}.grad_dtype == GradDtype::fp32);
  CHECK_FALSE(plan_to_json(Plan{}).contains("grad_dtype"));  // old plans and checkpoints read the same
  CHECK(gradient_bytes(Plan{}) == 4);

  auto file = plan_overrides_from_json({{"grad_dtype", "bf16"}, {"dp", 2}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->grad_dtype == GradDtype::bf16);
  CHECK(gradient_bytes(*p) == 2);
  CHECK(validate_plan(*p, tiny()).ok());  // the default precision is bf16
  CHECK(plan_to_json(*p)["grad_dtype"] == "bf16");
  PlanOverrides flags;
  flags.grad_dtype = "fp32";
  CHECK(apply_overrides(*p, flags)->grad_dtype == GradDtype::fp32);

  auto typo = plan_overrides_from_json({{"grad_dtype", "bf61"}});
  REQUIRE(typo.ok());
  CHECK_THAT(error_of(apply_overrides(Plan{}, *typo)), Catch::Contains("did you mean 'bf16'"));
  CHECK_THAT(error_of(plan_overrides_from_json({{"grad_dtype", 16}})), Catch::Contains("grad_dtype"));

  Plan fp32 = *p;
  fp32.precision = Precision::fp32;
  CHECK_THAT(rejection(fp32, tiny()), Catch::Contains("grad_dtype (--grad-dtype) bf16 needs precision bf16 or fp8, "
                                                      "got fp32"));
  fp32.precision = Precision::fp8;
  CHECK(validate_plan(fp32, tiny()).ok());
  Plan compressed = *p;
  compressed.grad_compression = GradCompression::fp16;
  CHECK_THAT(rejection(compressed, tiny()),
             Catch::Contains("does not combine with grad_compression (--grad-compression) fp16"));
}

TEST_CASE("FP8 parameters are a plan switch that a written plan keeps, and the whole plan's", "[plan]") {
  CHECK_FALSE(Plan{}.fp8_param_gather);
  CHECK_FALSE(plan_to_json(Plan{}).contains("fp8_param_gather"));
  auto file = plan_overrides_from_json({{"fp8_param_gather", true}, {"precision", "fp8"}, {"zero", 1}, {"dp", 2}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->fp8_param_gather);
  CHECK(plan_to_json(*p)["fp8_param_gather"] == true);
  CHECK(precision_label(*p) == "fp8, FP8 parameters");
  CHECK_THAT(error_of(plan_overrides_from_json({{"fp8_param_gather", 1}})), Catch::Contains("fp8_param_gather"));
}

TEST_CASE("pipeline communication overlap is a plan switch of the interleaved schedule", "[plan]") {
  CHECK_FALSE(Plan{}.overlap_p2p_comm);
  CHECK_FALSE(plan_to_json(Plan{}).contains("overlap_p2p_comm"));
  auto file = plan_overrides_from_json(
      {{"overlap_p2p_comm", true}, {"pp", 2}, {"vpp", 2}, {"schedule", "interleaved"}, {"global_batch", 4}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->overlap_p2p_comm);
  CHECK(plan_to_json(*p)["overlap_p2p_comm"] == true);
  CHECK(validate_plan(*p, tiny()).ok());
  Plan one_f_one_b = *p;
  one_f_one_b.schedule = ScheduleKind::one_f_one_b, one_f_one_b.vpp = 1;
  CHECK_THAT(rejection(one_f_one_b, tiny()),
             Catch::Contains("overlap_p2p_comm (--overlap-p2p-comm) needs the interleaved schedule with pp > 1, got "
                             "1f1b with pp 2") &&
                 Catch::Contains("--schedule interleaved"));
}

TEST_CASE("EP all-to-all overlap is a plan switch that a written plan keeps", "[plan]") {
  CHECK_FALSE(Plan{}.moe_a2a_overlap);
  CHECK_FALSE(plan_to_json(Plan{}).contains("moe_a2a_overlap"));
  auto file = plan_overrides_from_json({{"moe_a2a_overlap", true}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->moe_a2a_overlap);
  CHECK(plan_to_json(*p)["moe_a2a_overlap"] == true);
  CHECK_THAT(error_of(plan_overrides_from_json({{"moe_a2a_overlap", "yes"}})), Catch::Contains("moe_a2a_overlap"));
}

TEST_CASE("the FP8 recipe and the recompute modules are plan fields with checked values", "[plan]") {
  CHECK(Plan{}.fp8_recipe == Fp8Recipe::delayed);
  CHECK_FALSE(plan_to_json(Plan{}).contains("fp8_recipe"));
  CHECK_FALSE(plan_to_json(Plan{}).contains("recompute_modules"));
  auto file = plan_overrides_from_json(
      {{"precision", "fp8"}, {"fp8_recipe", "current"}, {"recompute_modules", {"moe_act", "layernorm"}}});
  REQUIRE(file.ok());
  auto p = apply_overrides(Plan{}, *file);
  REQUIRE(p.ok());
  CHECK(p->fp8_recipe == Fp8Recipe::current);
  CHECK(p->recompute_modules == RecomputeModules{true, true});
  const nlohmann::json j = plan_to_json(*p);
  CHECK(j["fp8_recipe"] == "current");
  CHECK(j["recompute_modules"] == nlohmann::json({"layernorm", "moe_act"}));
  CHECK(recompute_label(*p) == "none+layernorm,moe_act");
  CHECK(precision_label(*p) == "fp8 (current scaling)");
  // The written plan reads back the same (less the derived fields a plan file leaves out).
  nlohmann::json file_fields = j;
  file_fields.erase("world_size"), file_fields.erase("microbatches");
  auto again = plan_overrides_from_json(file_fields);
  REQUIRE(again.ok());
  CHECK(apply_overrides(Plan{}, *again)->recompute_modules == p->recompute_modules);

  CHECK_THAT(error_of(apply_overrides(Plan{}, *plan_overrides_from_json({{"fp8_recipe", "tensorwise"}}))),
             Catch::Contains("unknown FP8 recipe 'tensorwise'"));
  CHECK_THAT(error_of(plan_overrides_from_json({{"recompute_modules", "layernorm"}})),
             Catch::Contains("must be a list of module names"));
  CHECK_THAT(error_of(apply_overrides(Plan{}, *plan_overrides_from_json({{"recompute_modules", {"mlp"}}}))),
             Catch::Contains("unknown recompute module 'mlp'"));
  CHECK_THAT(error_of(apply_overrides(Plan{}, *plan_overrides_from_json({{"recompute_modules", {"core_attn"}}}))),
             Catch::Contains("is --recompute selective"));

  Plan bf16 = *p;
  bf16.precision = Precision::bf16;
  CHECK_THAT(rejection(bf16, tiny()), Catch::Contains("fp8_recipe (--fp8-recipe) current scales FP8 tensors, but the "
                                                      "plan's precision is bf16"));
  Plan dense = *p;  // tiny has no experts
  CHECK_THAT(rejection(dense, tiny()), Catch::Contains("recompute module moe_act recomputes the routed experts' "
                                                       "activation, and model 'tiny' has no experts"));
  // Full recomputation makes every module again: the modules add nothing there (the planner's full
  // candidates keep a plan's modules without being refused).
  Plan full = *p;
  full.recompute = Recompute::full;
  CHECK(validate_plan(full, *model_preset("tiny-moe")).ok());
  CHECK(effective_recompute_modules(full) == RecomputeModules{});
  CHECK(recompute_label(full) == "full");
  full.recompute_modules.moe_act = false;
  full.recompute = Recompute::selective;
  CHECK_THAT(rejection(full, tiny()), Catch::Contains("recompute module layernorm recomputes an MoE layer's "
                                                      "pre-MLP norm"));
  CHECK(validate_plan(full, *model_preset("tiny-moe")).ok());
}
