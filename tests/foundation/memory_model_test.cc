#include <catch2/catch.hpp>

#include "engine/memory/memory_model.h"
#include "models/parameters.h"

using namespace meshtrain;

namespace {
Plan plan_for(int tp, bool sp, Recompute r) {
  Plan p;
  p.tp = tp, p.sequence_parallel = sp, p.recompute = r;
  return p;
}
}  // namespace

TEST_CASE("per-layer activations reproduce Korthikanti et al. 2022", "[memory]") {
  // Sec. 4: s·b·h·(34 + 5as/h) unparallelised; with tensor parallelism
  // s·b·h·(10 + 24/t + 5as/(ht)); with sequence parallelism s·b·h/t·(34 + 5as/h);
  // selective recomputation with sp 34·s·b·h/t; full recomputation 2·s·b·h.
  ModelSpec m = *model_preset("megatron-18.4b");
  const double s = 2048, b = 1, h = 6144, a = 48;
  const double sbh = s * b * h;
  const ActivationLayout paper = korthikanti_layout();
  CHECK(layer_activation_bytes(m, plan_for(1, false, Recompute::none), paper) ==
        Approx(sbh * (34 + 5 * a * s / h)));
  for (int t : {2, 4, 8}) {
    INFO("t = " << t);
    CHECK(layer_activation_bytes(m, plan_for(t, false, Recompute::none), paper) ==
          Approx(sbh * (10 + 24.0 / t + 5 * a * s / (h * t))));
    CHECK(layer_activation_bytes(m, plan_for(t, true, Recompute::none), paper) ==
          Approx(sbh / t * (34 + 5 * a * s / h)));
    CHECK(layer_activation_bytes(m, plan_for(t, true, Recompute::selective), paper) == Approx(sbh * 34 / t));
  }
  CHECK(layer_activation_bytes(m, plan_for(1, false, Recompute::full), paper) == Approx(2 * sbh));
}

TEST_CASE("meshtrain's own layout saves fp32 values, lse and norm statistics", "[memory]") {
  ModelSpec m = *model_preset("tiny");  // s 64, h 64, a 4, ffn 256
  Plan p;
  p.precision = Precision::fp32;
  // 4 replicated + (3 + 1 + 4 + 4) split s·b·h values at 4 bytes; layernorm mean
  // and rstd of two norms and lse of 4 heads per row, fp32.
  const double rows = 64, sbh = 64 * 64;
  CHECK(layer_activation_bytes(m, p, meshtrain_layout(p)) == Approx(4 * 16 * sbh + 4 * (4 * rows + 4 * rows)));
}

TEST_CASE("ZeRO stages divide model states as in Rajbhandari et al. 2020", "[memory]") {
  // Ψ = 124,439,808 (GPT-2 124M), dp 4, mixed precision: 2Ψ + 2Ψ + 12Ψ in all;
  // stage 1 leaves 4Ψ + 12Ψ/4, stage 2 2Ψ + 14Ψ/4, stage 3 16Ψ/4.
  ModelSpec m = *model_preset("gpt2-124m");
  const double psi = 124'439'808.0;
  Plan p;
  p.dp = 4;
  auto states = [&](int zero) {
    p.zero = zero;
    // The paper's accounting (16-bit gradients); meshtrain's own is checked below.
    MemoryBreakdown b = memory_per_rank(m, p, 0, korthikanti_layout());
    REQUIRE(b.parameter_count == 124'439'808);
    return b.parameters + b.gradients + b.optimizer;
  };
  CHECK(states(0) == Approx(16 * psi));
  CHECK(states(1) == Approx(7 * psi));
  CHECK(states(2) == Approx(5.5 * psi));
  CHECK(states(3) == Approx(4 * psi));
  // fp32 training keeps no master copy: 4 + 4 + 8 bytes.
  p.precision = Precision::fp32;
  CHECK(states(0) == Approx(16 * psi));
  CHECK(states(1) == Approx(8 * psi + 2 * psi));
  // meshtrain accumulates gradients in fp32 (Megatron's main_grad): 2 + 4 + 12 bytes.
  p.precision = Precision::bf16, p.zero = 0;
  const MemoryBreakdown own = memory_per_rank(m, p, 0, meshtrain_layout(p));
  CHECK(own.parameters + own.gradients + own.optimizer == Approx(18 * psi));
}

TEST_CASE("ZeRO-3 holds the current and the prefetched layer", "[memory]") {
  ModelSpec m = *model_preset("gpt2-124m");
  Plan p;
  p.dp = 4, p.zero = 3;
  const double layer = 12.0 * 768 * 768 + 13 * 768;
  CHECK(memory_per_rank(m, p, 0, korthikanti_layout()).zero3_working == Approx(layer * (2 + 2 + 2)));
  CHECK(memory_per_rank(m, p, 0, meshtrain_layout(p)).zero3_working == Approx(layer * (2 + 2 + 4)));
}

TEST_CASE("in-flight micro-batches follow the schedule", "[memory]") {
  Plan p;
  p.pp = 4, p.global_batch = 8;  // m = 8
  p.schedule = ScheduleKind::one_f_one_b;
  CHECK(inflight_microbatches(p, 0) == 4);
  CHECK(inflight_microbatches(p, 3) == 1);
  p.schedule = ScheduleKind::gpipe;
  CHECK(inflight_microbatches(p, 2) == 8);
  p.schedule = ScheduleKind::interleaved, p.vpp = 2;
  CHECK(inflight_microbatches(p, 0) == 11);  // (4-1)·2 + (2-1)·4 + 1
  CHECK(inflight_microbatches(p, 3) == 5);
}

TEST_CASE("interleaving holds L·(1 + (p−1)/(p·v)) layers of activations on stage 0", "[memory]") {
  // Korthikanti et al. 2022, Sec. 4.2.3.
  ModelSpec m = *model_preset("tiny");
  m.layers = 8;
  Plan p;
  p.pp = 4, p.vpp = 2, p.global_batch = 8, p.schedule = ScheduleKind::interleaved;
  const ActivationLayout a = korthikanti_layout();
  const double per_layer = layer_activation_bytes(m, p, a);
  CHECK(memory_per_rank(m, p, 0, a).activations == Approx(8 * (1 + 3.0 / 8) * per_layer));
  p.schedule = ScheduleKind::one_f_one_b, p.vpp = 1;
  CHECK(memory_per_rank(m, p, 0, a).activations == Approx(8 * per_layer));  // p micro-batches × L/p layers
}

TEST_CASE("ZeRO-3 in fp8 holds the cast of the layer in use, and FP8 parameters shard at a byte", "[memory][fp8]") {
  // GPT-2 124M, dp 4: each layer's FP8 linears hold 12·768² weights (qkv, out, up, down), the largest
  // layer's unit 12·768² + 13·768 elements. Below ZeRO 3 an FP8 run keeps every FP8 weight's cast with its
  // transpose (2 bytes); under it each gathered layer is cast as it is used, so the working set holds
  // one layer's cast, and the parameters none.
  ModelSpec m = *model_preset("gpt2-124m");
  const double fp8_layer = 12.0 * 768 * 768, fp8_all = 12 * fp8_layer;
  Plan bf16;
  bf16.dp = 4, bf16.zero = 3;
  Plan fp8 = bf16;
  fp8.precision = Precision::fp8;
  const MemoryBreakdown a = memory_per_rank(m, bf16, 0, meshtrain_layout(bf16));
  const MemoryBreakdown b = memory_per_rank(m, fp8, 0, meshtrain_layout(fp8));
  CHECK(b.parameters == Approx(a.parameters));
  CHECK(b.zero3_working - a.zero3_working == Approx(2 * fp8_layer));
  // With FP8 parameters a rank's shard of each FP8 weight is one byte, and the gathered layer's FP8
  // values and transpose take the 16-bit weights' place.
  fp8.fp8_param_gather = true;
  const MemoryBreakdown c = memory_per_rank(m, fp8, 0, meshtrain_layout(fp8));
  CHECK(a.parameters - c.parameters == Approx(fp8_all / 4));
  CHECK(c.zero3_working == Approx(a.zero3_working));
  // Nothing else moves: no second copy of the layer's gradient, the saved GEMM inputs as fp8's.
  CHECK(c.gradient_working == Approx(a.gradient_working));
  CHECK(c.total() - b.total() == Approx((c.parameters - b.parameters) + (c.zero3_working - b.zero3_working)));
  // ZeRO 1: every FP8 weight's cast and transpose, or, as FP8 parameters, none more than bf16.
  fp8.zero = bf16.zero = 1, fp8.fp8_param_gather = false;
  const double bf16_parameters = memory_per_rank(m, bf16, 0, meshtrain_layout(bf16)).parameters;
  CHECK(memory_per_rank(m, fp8, 0, meshtrain_layout(fp8)).parameters - bf16_parameters == Approx(2 * fp8_all));
  fp8.fp8_param_gather = true;
  CHECK(memory_per_rank(m, fp8, 0, meshtrain_layout(fp8)).parameters == Approx(bf16_parameters));
}

TEST_CASE("with experts and context parallelism the dense states shard over dp·cp", "[memory][moe]") {
  // The dense parameters' replicas are the data and context ranks (the engine's data_context group), the
  // experts' their expert-data group: cp 2, dp 2, ep 2 on tp 1 gives dense states over 4 ranks and
  // experts over tp·cp·dp / (etp·ep) = 2.
  ModelSpec m = *model_preset("tiny-moe");
  Plan p;
  p.cp = 2, p.dp = 2, p.ep = 2, p.zero = 1;
  const MemoryBreakdown b = memory_per_rank(m, p, 0, meshtrain_layout(p));
  const double experts = static_cast<double>(b.expert_parameter_count);
  const double dense = static_cast<double>(b.parameter_count) - experts;
  REQUIRE(experts > 0);
  CHECK(b.optimizer == Approx(12 * (dense / 4 + experts / 2)));
}
