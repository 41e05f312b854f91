// The elementwise kernels that move 16 bytes per access where their tensors
// are aligned (kernels/elementwise.cu: add, GELU forward and backward, cast)
// give the same bits as their one-element-at-a-time path, which tensors one
// element into their buffer take. Sizes leave a tail after the last pack.
// Without a device each test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

TEST_CASE("cuda elementwise: 16-byte and one-element paths give the same bits", "[cuda][gpu]") {
  MT_GPU_OR_SKIP(gpu);
  for (const std::int64_t n : {std::int64_t{100003}, std::int64_t{13}, std::int64_t{4096}}) {
    const Vec a = random(static_cast<std::size_t>(n + 1), 401, 3.f), b = random(static_cast<std::size_t>(n + 1), 402);
    for (DType d : {DType::bf16, DType::f16, DType::f32}) {
      INFO("n " << n << " " << dtype_name(d));
      // offset 0: aligned (packs); offset 1: misaligned (one element at a time).
      auto run = [&](std::int64_t offset) {
        auto view = [&](const Vec& v, DType dt) {  // v[0, n) at element `offset` of its buffer
          Vec buffer(static_cast<std::size_t>(n + 1), 0.f);
          std::copy(v.begin(), v.begin() + n, buffer.begin() + offset);
          return up(gpu, {n + 1}, buffer, dt).slice(offset, n, {n});
        };
        Tensor A = view(a, d), B = view(b, d), O = view(Vec(a.size(), 0.f), d);
        Tensor G = view(Vec(a.size(), 0.f), d), DG = view(Vec(a.size(), 0.f), d);
        Tensor W = view(Vec(a.size(), 0.f), DType::f32), H = view(Vec(a.size(), 0.f), d);
        gpu.add(A, B, O);
        gpu.gelu_forward(A, G);
        gpu.gelu_backward(B, A, DG);
        gpu.cast(A, W);  // to fp32
        gpu.cast(W, H);  // and back
        gpu.add(B, A, B);  // in place
        return down_all(gpu, {&O, &G, &DG, &W, &H, &B});
      };
      const Vec packed = run(0), single = run(1);
      REQUIRE(packed.size() == single.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < packed.size(); ++i)
        if (!(packed[i] == single[i])) ++differ;
      CHECK(differ == 0);
      // And the values are right: the cast round trip keeps a 16-bit tensor's values.
      CHECK(down(gpu, up(gpu, {n}, Vec(a.begin(), a.end() - 1), d)) ==
            Vec(packed.begin() + 3 * n, packed.begin() + 4 * n));
    }
  }
}
