#include <catch2/catch.hpp>

#include "models/flops.h"

using namespace meshtrain;

namespace {
// Narayanan et al. 2021, eq. (3): FLOPs per iteration with full recomputation,
// and the same derivation without it (3 passes instead of 4 over the layers).
double megatron_full(double B, double s, double l, double h, double V) {
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}
double megatron_none(double B, double s, double l, double h, double V) {
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}
}  // namespace

TEST_CASE("FLOPs agree with Megatron-LM's formula", "[flops]") {
  for (const char* name : {"megatron-1.7b", "megatron-18.4b", "megatron-145.6b", "megatron-1t", "gpt3-175b"}) {
    INFO(name);
    ModelSpec m = *model_preset(name);
    const double B = 512, s = m.seq_len;
    FlopCount full = training_flops(m, 512, m.seq_len, Recompute::full);
    FlopCount none = training_flops(m, 512, m.seq_len, Recompute::none);
    CHECK(full.hardware == Approx(megatron_full(B, s, m.layers, m.hidden, m.vocab)).epsilon(0.01));
    CHECK(none.hardware == Approx(megatron_none(B, s, m.layers, m.hidden, m.vocab)).epsilon(0.01));
    CHECK(none.model == full.model);  // model FLOPs do not count recomputation
  }
}

TEST_CASE("FLOPs per token follow 6N plus attention", "[flops]") {
  // Kaplan et al. 2020: C ≈ 6·N_matmul + 12·l·s·h per token: three passes over
  // every weight, and attention's two matmuls of 2·s·h FLOPs each per token.
  ModelSpec m = *model_preset("gpt2-124m");
  const double n_matmul = 12.0 * (12.0 * 768 * 768) + 50257.0 * 768;  // layers + tied head
  const double expected = 6 * n_matmul + 12.0 * 12 * 1024 * 768;  // 12·l·s·h
  FlopCount f = training_flops(m, 1, 1024, Recompute::none);
  CHECK(f.per_token == Approx(expected).epsilon(1e-9));
}

TEST_CASE("selective recomputation reruns only the attention core", "[flops]") {
  ModelSpec m = *model_preset("gpt2-124m");
  FlopCount sel = training_flops(m, 2, 1024, Recompute::selective);
  // 12 layers · (q·kᵀ + p·v) = 12 · 2 · 2·B·s²·h
  CHECK(sel.hardware - sel.model == Approx(12.0 * 2 * 2 * 2 * 1024.0 * 1024 * 768));
}

TEST_CASE("MoE FLOPs count top_k experts per token", "[flops]") {
  ModelSpec dense = *model_preset("tiny");
  ModelSpec moe = dense;
  moe.experts = 8;
  moe.top_k = 2;
  ForwardFlops d = forward_flops(dense, 1, 64), e = forward_flops(moe, 1, 64);
  // Two experts' MLPs instead of one, plus the router (C × E) per token.
  const double mlp = 4 * (2.0 * 64 * 64 * 256 * 2);  // 4 layers, up and down, 64 tokens
  const double router = 4 * 2.0 * 64 * 64 * 8;
  CHECK(e.layers - d.layers == Approx(mlp + router));
}
