// Gradient compression's device side, cuda against the cpu reference: 1-bit
// sign compression with error feedback (same signs and packets, scales and
// errors to fp32 rounding), its decompression, and AdamW with a frozen
// variance (1-bit Adam). Without a CUDA device each test prints "SKIPPED: no
// CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

struct Compressed {
  Vec packets, out, error;
};

// C chunks of k: compress with error feedback, decompress.
Compressed compress(Backend& b, const Vec& x, const Vec& e, std::int64_t C, std::int64_t k) {
  Tensor tx = up(b, Shape{C, k}, x), te = up(b, Shape{C, k}, e);
  Tensor packets = b.empty(Shape{C, 1 + (k + 31) / 32}, DType::i32), out = b.empty(Shape{C, k});
  b.sign_compress(tx, te, packets);
  b.sign_decompress(packets, out);
  return {down(b, packets), down(b, out), down(b, te)};
}

}  // namespace

TEST_CASE("cuda sign_compress and sign_decompress match the cpu", "[cuda][gpu][compression]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  // k = 20: one partial word; 256: the engine's chunk; 1000: several warps' words and a partial one.
  for (std::int64_t k : {20, 256, 1000}) {
    const std::int64_t C = 37;
    INFO("k " << k);
    const Vec x = random(static_cast<std::size_t>(C * k), 51), e = random(static_cast<std::size_t>(C * k), 52, 0.1f);
    const Compressed want = compress(cpu, x, e, C, k), got = compress(gpu, x, e, C, k);
    // Sign words bit for bit (read back as the float of each int32); scales to fp32 rounding of a
    // double sum in another order, which may flip the error of an element but no sign.
    const std::int64_t W = 1 + (k + 31) / 32;
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t w = 1; w < W; ++w) CHECK(got.packets[c * W + w] == want.packets[c * W + w]);
    expect_close(got.out, want.out, kF32, "decompressed");
    expect_close(got.error, want.error, kF32, "error");
  }
}

TEST_CASE("cuda adamw with a frozen variance matches the cpu and keeps v", "[cuda][gpu][compression]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  const std::int64_t n = 4096;
  const Vec p = random(n, 61), g = random(n, 62), m = random(n, 63, 0.1f);
  const Vec v = random_second_moment(n, 64);
  AdamWOp op{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 40};
  op.variance_frozen_at = 7;
  auto run = [&](Backend& b) {
    Tensor tp = up(b, Shape{n}, p), tm = up(b, Shape{n}, m), tv = up(b, Shape{n}, v);
    b.adamw(tp, up(b, Shape{n}, g), tm, tv, Tensor(), op);
    return std::vector<Vec>{down(b, tp), down(b, tm), down(b, tv)};
  };
  const auto want = run(cpu), got = run(gpu);
  expect_close(got[0], want[0], kF32, "param");
  expect_close(got[1], want[1], kF32, "m");
  CHECK(got[2] == want[2]);  // v keeps its bits on both
}
