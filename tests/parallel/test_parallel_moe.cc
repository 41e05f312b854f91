// Mixture-of-experts models under expert parallelism (alone, with tensor,
// sequence and pipeline parallelism, ZeRO, whole or split experts), dropless
// and with a capacity factor, compute what the single-rank run computes: the
// same checks and tolerances as every other plan (parallel_check.h).
#include <catch2/catch.hpp>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// tiny-moe: GELU experts, top 2 of 8, renormalised, dropless; the z-loss on
// so that its gradient is checked too.
ModelSpec moe() {
  ModelSpec m = *model_preset("tiny-moe");
  m.z_loss_coeff = 1e-3f;
  return m;
}

// A capacity of 1.0 · N·K/E = 8 of a micro-batch's 64 assignments per
// expert: every step drops some (the reference cache keys on the name).
ModelSpec capped() {
  ModelSpec m = moe();
  m.name = "tiny-moe-capped";
  m.capacity_factor = 1.0f;
  return m;
}

// Llama-style: SwiGLU experts without renormalisation, a shared expert, MoE
// on every second layer (0 and 2) and dense layers of their own width.
ModelSpec llama_moe() {
  ModelSpec m = tiny_llama();
  m.name = "tiny-llama-moe";
  m.experts = 4, m.top_k = 2, m.ffn = 32;
  m.shared_experts = 1, m.renormalize = false, m.moe_every = 2, m.dense_ffn = 96;
  m.aux_loss_coeff = 0.02f;
  return m;
}

Plan with_ep(Plan p, int ep, int etp = 0) {
  p.ep = ep, p.etp = etp;
  return p;
}

Plan sp(Plan p) {
  p.sequence_parallel = true;
  return p;
}

}  // namespace

TEST_CASE("expert parallelism 2 and 4 match the single-rank run, dropless and capped", "[parallel][moe][ep]") {
  for (const ModelSpec& m : {moe(), capped()}) {
    check_matches_reference(m, with_ep(make_plan(1, 1, 2, 0, ScheduleKind::one_f_one_b), 2));
    check_matches_reference(m, with_ep(make_plan(1, 1, 4, 0, ScheduleKind::one_f_one_b), 4));
  }
}

TEST_CASE("ep 2 × tp 2 matches the single-rank run, experts split or whole, with and without SP",
          "[parallel][moe][tp]") {
  for (const ModelSpec& m : {moe(), capped()}) {
    check_matches_reference(m, with_ep(make_plan(2, 1, 2, 0, ScheduleKind::one_f_one_b), 2));
    check_matches_reference(m, sp(with_ep(make_plan(2, 1, 2, 0, ScheduleKind::one_f_one_b), 2)));
  }
  check_matches_reference(moe(), make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));  // etp 2 without ep
  check_matches_reference(moe(), with_ep(make_plan(2, 1, 2, 0, ScheduleKind::one_f_one_b), 2, 1));
  check_matches_reference(moe(), sp(with_ep(make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b), 4, 1)));
}

TEST_CASE("ep with pp 2 and ZeRO 1 matches the single-rank run, dropless and capped", "[parallel][moe][pp]") {
  for (const ModelSpec& m : {moe(), capped()})
    check_matches_reference(m, with_ep(make_plan(1, 2, 2, 1, ScheduleKind::one_f_one_b), 2));
}

TEST_CASE("expert data parallelism, ZeRO 2 and 3, and interleaving match the single-rank run",
          "[parallel][moe][zero]") {
  // dp 4 with ep 2: two replicas of each expert, whose gradients reduce over the expert-data group.
  check_matches_reference(moe(), with_ep(make_plan(1, 1, 4, 2, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(moe(), with_ep(make_plan(1, 2, 2, 3, ScheduleKind::interleaved, 2), 2));
}

TEST_CASE("a Llama-style MoE with a shared expert and dense layers between matches the single-rank run",
          "[parallel][moe][llama]") {
  check_matches_reference(llama_moe(), with_ep(make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(llama_moe(), sp(with_ep(make_plan(2, 2, 2, 0, ScheduleKind::gpipe), 2)));
}

TEST_CASE("an MoE plan twice gives identical bits", "[parallel][moe][determinism]") {
  const Plan p = with_ep(make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b), 2);
  const PlanRun a = run_plan(capped(), p), b = run_plan(capped(), p);
  CHECK(a.ranks[0].losses == b.ranks[0].losses);
  CHECK(a.ranks[0].grad_norms == b.ranks[0].grad_norms);
  CHECK(a.ranks[0].state == b.ranks[0].state);
}

TEST_CASE("EP all-to-all overlap matches the single-rank run with the bits of the plan without it",
          "[parallel][moe][a2a_overlap]") {
  // Interleaving one micro-batch's forward with another's backward reorders independent work only: every
  // gradient still sums its micro-batches in the same order.
  auto overlapped = [](Plan p) {
    p.moe_a2a_overlap = true;
    return p;
  };
  // pp 1: four micro-batches, three pairs; tp 2 with whole experts makes the EP group of 2.
  const Plan tp_ep = with_ep(make_plan(2, 1, 1, 1, ScheduleKind::one_f_one_b), 2, 1);
  check_matches_reference(moe(), overlapped(tp_ep));
  check_same_bits(moe(), tp_ep, overlapped(tp_ep));
  // Three layers: a pair's forward of the middle layer runs beside its backward in the same layer.
  ModelSpec odd = moe();
  odd.name = "tiny-moe-3";
  odd.layers = 3;
  check_same_bits(odd, tp_ep, overlapped(tp_ep));
  // Expert data parallelism under sequence parallelism, a shared expert and dense layers between.
  const Plan dp_ep = sp(with_ep(make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(llama_moe(), overlapped(dp_ep));
  // Interleaved pp 2: a pair's forward and backward are different model chunks.
  const Plan pp = with_ep(make_plan(2, 2, 1, 1, ScheduleKind::interleaved, 2), 2, 1);
  check_matches_reference(moe(), overlapped(pp));
  check_same_bits(moe(), pp, overlapped(pp));
  // FP8 emulation: the casts of both passes keep their scales.
  StepOptions fp8 = step_options();
  fp8.emulate_fp8 = true;
  Plan fp8_ep = tp_ep;
  fp8_ep.precision = Precision::fp8;
  check_same_bits(moe(), fp8_ep, overlapped(fp8_ep), fp8);
}
