// The bytes a rank sends per step under gradient compression against the
// uncompressed plan, as its communicator counts them: one check for the cpu
// communicators (test_grad_compression.cc) and NCCL (tests/cuda/
// test_nccl_bytes_mpi.cc).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/plan/plan.h"

namespace meshtrain::testing {

// `bytes_per_step(p)`: what one rank sends in each of three steps of p, a
// ZeRO 0 or 1 plan with one gradient bucket per stage.
inline void check_compressed_bytes(const Plan& p,
                                   const std::function<std::vector<std::int64_t>(const Plan&)>& bytes_per_step) {
  // The per-step fixed traffic (loss, norm) is a few floats against the ~100k gradients. fp32
  // sends 2·(G−1)/G of the bucket's 4-byte elements per rank; bf16/fp16 the same count of 2-byte
  // ones; 1bit 9 words per chunk of 256: 36/1024.
  const std::vector<std::int64_t> plain = bytes_per_step(p);
  // Every step of the plain run sends the same bytes.
  CHECK(plain[0] == plain[1]);
  CHECK(plain[1] == plain[2]);
  const auto ratio = [&](GradCompression c) {
    Plan q = p;
    q.grad_compression = c;
    const std::vector<std::int64_t> sent = bytes_per_step(q);
    return static_cast<double>(sent[1]) / static_cast<double>(plain[1]);
  };
  const double bf16 = ratio(GradCompression::bf16), fp16 = ratio(GradCompression::fp16);
  const double one_bit = ratio(GradCompression::one_bit);
  INFO("bf16 " << bf16 << ", fp16 " << fp16 << ", 1bit " << one_bit);
  // ZeRO 0: the all-reduce is all of a step's traffic. ZeRO 1: the gradient reduce-scatter
  // (its phase 1 only) is half; the other half, the all-gather of the updated fp32
  // parameters, moves the same (G−1)·k elements and is not compressed: (1 + c) / 2.
  const auto expected = [&](double c) { return p.zero == 0 ? c : (1 + c) / 2; };
  CHECK(bf16 == Approx(expected(0.5)).margin(0.005));
  CHECK(fp16 == Approx(expected(0.5)).margin(0.005));
  // 1bit: a 4-byte scale and 32 bytes of signs per 256 gradients of 4 bytes.
  CHECK(one_bit == Approx(expected(36.0 / 1024)).margin(0.002));
}

}  // namespace meshtrain::testing
