// Every hybrid plan computes what the single-rank run computes: losses, the
// gradient norm and the final (gathered) parameters after kSteps steps on the
// same global batch, ranks as threads.
#include <catch2/catch.hpp>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

TEST_CASE("tensor parallel matches the single-rank run", "[parallel][tp]") {
  check_matches_reference(tiny_gpt(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(tiny_gpt(), make_plan(4, 1, 1, 0, ScheduleKind::one_f_one_b));
}

TEST_CASE("a vocabulary that tp does not divide matches the single-rank run", "[parallel][tp][vocab]") {
  // 255 ids: tp 2 and 4 pad the last shard (to 256); its padding must stay
  // out of the softmax, with the embedding tied and untied.
  for (bool tied : {true, false}) {
    ModelSpec m = tiny_gpt();
    m.vocab = 255;
    m.tied_embeddings = tied;
    m.name = tied ? "tiny-v255-tied" : "tiny-v255";  // the reference cache keys on the name
    check_matches_reference(m, make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
    check_matches_reference(m, make_plan(4, 2, 1, 0, ScheduleKind::one_f_one_b));
  }
}

TEST_CASE("pipeline schedules match the single-rank run", "[parallel][pp]") {
  check_matches_reference(tiny_gpt(), make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(tiny_gpt(), make_plan(1, 4, 1, 0, ScheduleKind::gpipe));
  check_matches_reference(tiny_gpt(), make_plan(1, 2, 1, 0, ScheduleKind::interleaved, 2));
}

TEST_CASE("data parallel and ZeRO match the single-rank run", "[parallel][dp]") {
  for (int zero : {0, 1, 2, 3})
    check_matches_reference(tiny_gpt(), make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b));
}

TEST_CASE("data parallel with other bucket sizes and after-backward sync matches the single-rank run",
          "[parallel][dp][buckets]") {
  auto buckets = [](Plan p, double mb, GradSync sync) {
    p.grad_bucket_mb = mb, p.grad_sync = sync;
    return p;
  };
  // 4 MiB holds the tiny model's whole stage: one bucket; 3 KiB cuts buckets across parameters.
  for (int zero : {0, 1}) {
    const Plan dp2 = make_plan(1, 1, 2, zero, ScheduleKind::one_f_one_b);
    check_matches_reference(tiny_gpt(), buckets(dp2, 4, GradSync::overlap));
    check_matches_reference(tiny_gpt(), buckets(dp2, 3.0 / 1024, GradSync::overlap));
    check_matches_reference(tiny_gpt(), buckets(dp2, 3.0 / 1024, GradSync::after_backward));
  }
  check_matches_reference(tiny_gpt(), buckets(make_plan(2, 2, 2, 1, ScheduleKind::interleaved, 2), 4,
                                              GradSync::after_backward));
}

TEST_CASE("ZeRO-3 under tp2 pp2 dp2 matches the single-rank run for each schedule", "[parallel][zero3]") {
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 3, ScheduleKind::gpipe));
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 3, ScheduleKind::one_f_one_b));
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 3, ScheduleKind::interleaved, 2));
  check_matches_reference(tiny_llama(), make_plan(1, 2, 2, 3, ScheduleKind::one_f_one_b));
}

TEST_CASE("sequence parallelism matches the single-rank run", "[parallel][sp]") {
  auto sp = [](Plan p) {
    p.sequence_parallel = true;
    return p;
  };
  check_matches_reference(tiny_gpt(), sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
  check_matches_reference(tiny_gpt(), sp(make_plan(2, 2, 2, 1, ScheduleKind::one_f_one_b)));
  check_matches_reference(tiny_gpt(), sp(make_plan(2, 2, 2, 3, ScheduleKind::interleaved, 2)));
  check_matches_reference(tiny_llama(), sp(make_plan(2, 2, 2, 2, ScheduleKind::gpipe)));
}

TEST_CASE("ZeRO-2 with full recomputation matches the single-rank run", "[parallel][zero2]") {
  Plan p = make_plan(2, 2, 2, 2, ScheduleKind::one_f_one_b);
  p.recompute = Recompute::full;
  check_matches_reference(tiny_gpt(), p);
}

TEST_CASE("tp2 pp2 dp2 (8 ranks) matches the single-rank run for each schedule and ZeRO stage",
          "[parallel][hybrid]") {
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 1, ScheduleKind::gpipe));
  check_matches_reference(tiny_gpt(), make_plan(2, 2, 2, 2, ScheduleKind::interleaved, 2));
}

TEST_CASE("a Llama-style model under tensor and hybrid parallelism matches the single-rank run",
          "[parallel][llama]") {
  check_matches_reference(tiny_llama(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
  check_matches_reference(tiny_llama(), make_plan(2, 2, 2, 1, ScheduleKind::one_f_one_b));
}

TEST_CASE("uneven pipeline stages match the single-rank run", "[parallel][pp][uneven]") {
  // 6 layers: stage 0 holds 2 and stage 1 holds 4 (given both, or only the first).
  check_matches_reference(tiny_gpt6(), with_stage_layers(make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), 2, 4));
  check_matches_reference(tiny_gpt6(), with_stage_layers(make_plan(2, 2, 2, 1, ScheduleKind::gpipe), 2, 0));
  // 1 + 4 + 1 over three stages; the tied embedding spans stages 0 and 2.
  check_matches_reference(tiny_gpt6(), with_stage_layers(make_plan(1, 3, 1, 3, ScheduleKind::one_f_one_b), 1, 1));
  // Interleaved: virtual stages of 1, 2, 1, 2 layers (stage 0 holds 2, stage 1 holds 4, two chunks each).
  check_matches_reference(tiny_gpt6(),
                          with_stage_layers(make_plan(1, 2, 2, 2, ScheduleKind::interleaved, 2), 2, 4));
}

TEST_CASE("the same plan twice gives identical bits", "[parallel][determinism]") {
  for (int zero : {1, 3}) {
    const Plan p = make_plan(2, 2, 2, zero, ScheduleKind::one_f_one_b);
    INFO(describe(p));
    const PlanRun a = run_plan(tiny_gpt(), p), b = run_plan(tiny_gpt(), p);
    CHECK(a.ranks[0].losses == b.ranks[0].losses);
    CHECK(a.ranks[0].grad_norms == b.ranks[0].grad_norms);
    CHECK(a.ranks[0].eval_loss == b.ranks[0].eval_loss);
    CHECK(a.ranks[0].state == b.ranks[0].state);
  }
}

TEST_CASE("the same plan on 1 or 3 threads per rank gives identical bits", "[parallel][determinism][threads]") {
  // Wide enough that every GEMM is cut into tiles and AdamW into many chunks.
  ModelSpec m = tiny_gpt();
  m.name = "wide-1";
  m.layers = 1, m.hidden = 256, m.heads = 4, m.ffn = 1024;
  for (const Plan& p : {make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b)}) {
    INFO(describe(p));
    const PlanRun one = run_plan(m, p, 1);
    for (int threads : {3}) {
      INFO(threads << " threads per rank");
      const PlanRun more = run_plan(m, p, threads);
      CHECK(more.ranks[0].losses == one.ranks[0].losses);
      CHECK(more.ranks[0].grad_norms == one.ranks[0].grad_norms);
      CHECK(more.ranks[0].state == one.ranks[0].state);
    }
  }
}

TEST_CASE("a rank that stops makes its peers' step fail with the op and group named", "[parallel][errors]") {
  const ModelSpec m = tiny_gpt();
  const Plan p = make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b);
  std::vector<std::string> errors(2);
  CommOptions fast;
  fast.timeout = std::chrono::milliseconds(2000);
  const Status s = run_ranks(
      2,
      [&](int rank, Communicator& comm) -> Status {
        CpuBackend b(comm);
        TrainingEngine engine(b, m, p, step_options());
        if (rank == 1) return ok_status();  // never joins the gradient reduction
        const std::vector<HostBatch> all = global_batch(m, 1);
        auto r = engine.step({all.begin(), all.begin() + p.microbatches()}, 1e-2f, 1);
        if (r.ok()) return make_error("step succeeded although rank 1 never took part");
        errors[0] = r.error().message();
        return std::move(r).error();
      },
      fast);
  REQUIRE_FALSE(s.ok());
  INFO(errors[0]);
  CHECK_THAT(errors[0], Catch::Contains("step 1"));
  CHECK_THAT(errors[0], Catch::Contains("reduce_scatter"));
  CHECK_THAT(errors[0], Catch::Contains("group"));
}

TEST_CASE("plans the engine cannot run yet are rejected up front with the reason", "[parallel][errors]") {
  Plan p = make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b);
  p.cp = 2;
  StepOptions dropout;
  dropout.dropout = 0.1f;
  auto cp = StepEngine::supports(p, dropout);
  REQUIRE_FALSE(cp.ok());
  CHECK_THAT(cp.error().message(), Catch::Contains("dropout 0.1 is not implemented under context parallelism"));
  CHECK(StepEngine::supports(p).ok());
  p.cp = 1, p.zero = 3, p.sequence_parallel = true;
  CHECK(StepEngine::supports(p, dropout).ok());
}

TEST_CASE("recompute modules (layernorm, moe_act) match the single-rank run, with the bits of the plan without them",
          "[parallel][recompute]") {
  // A recomputed norm or activation is the same kernel on the same kept input: the same bits.
  auto with = [](Plan p, RecomputeModules r) {
    p.recompute_modules = r;
    return p;
  };
  const ModelSpec moe = *model_preset("tiny-moe");
  // Sequence parallel: the pre-MLP norm's recomputed shard is gathered again for the router.
  Plan sp = make_plan(2, 2, 1, 1, ScheduleKind::one_f_one_b);
  sp.sequence_parallel = true;
  check_matches_reference(moe, with(sp, {true, true}));
  check_same_bits(moe, sp, with(sp, {true, true}));
  Plan ep = make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b);
  ep.ep = 2;
  check_matches_reference(moe, with(ep, {true, true}));
  check_same_bits(moe, ep, with(ep, {true, true}));
  // Zero-bubble's weight pass reads the recomputed tensors after their backward.
  const Plan zb = make_plan(1, 2, 1, 0, ScheduleKind::zb_h1);
  check_same_bits(moe, zb, with(zb, {true, true}));
  // FP8: the recomputed tensors' casts are made again (the casts a run keeps are what the modules free).
  StepOptions fp8 = step_options();
  fp8.emulate_fp8 = true;
  Plan fp8_ep = ep;
  fp8_ep.precision = Precision::fp8;
  check_same_bits(moe, fp8_ep, with(fp8_ep, {true, true}), fp8);
}
