// The FP8 cast and the amax pass on the device, against the cpu backend's
// exact emulation (core/fp8.h): the hardware conversion rounds as the
// emulation does, so casts of fp32 values match bit for bit, under delayed
// scaling (a given scale, the amax folded) and current scaling (the scale
// read from the amax tensor, left as it is), and the amax is a maximum,
// exact in any order. The FP8 GEMM that calibrate times runs through
// cuBLASLt with either accumulator. Without a CUDA device each test prints
// "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

struct Cast {
  Vec y, amax;
};

Cast cast(Backend& b, const Vec& x, const Fp8CastOp& op, float amax) {
  const auto n = static_cast<std::int64_t>(x.size());
  Tensor tx = up(b, Shape{n}, x), ty = b.empty(Shape{n}), ta = up(b, Shape{1}, Vec{amax});
  b.fp8_cast(tx, op, ty, ta);
  return {down(b, ty), down(b, ta)};
}

float amax_of(Backend& b, const Vec& x, float start) {
  Tensor ta = up(b, Shape{1}, Vec{start});
  b.amax(up(b, Shape{static_cast<std::int64_t>(x.size())}, x), ta);
  return down(b, ta)[0];
}

}  // namespace

TEST_CASE("cuda fp8_cast and amax give the cpu emulation's bits, delayed and current scaling", "[cuda][gpu][fp8]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  // 0 and 1 elements, one partial block, and more than the kernels' 4096 blocks of 256.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 21}) {
    INFO("n " << n);
    const Vec x = random(n, 71, 3.f);
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const Fp8CastOp delayed{37.5f, format, 2};
      const Cast want = cast(cpu, x, delayed, 0.5f), got = cast(gpu, x, delayed, 0.5f);
      CHECK(got.y == want.y);
      CHECK(got.amax == want.amax);
      // Current scaling: the scale is the amax tensor's (a tensor's amax, 0, or one that overflows the
      // scale), which stays as it was.
      for (float amax : {2.5f, 0.f, 2e-38f}) {
        INFO("amax " << amax);
        Fp8CastOp current = delayed;
        current.current = true;
        const Cast c_want = cast(cpu, x, current, amax), c_got = cast(gpu, x, current, amax);
        CHECK(c_got.y == c_want.y);
        CHECK(c_got.amax == Vec{amax});
      }
    }
    CHECK(amax_of(gpu, x, 0.f) == amax_of(cpu, x, 0.f));
    CHECK(amax_of(gpu, x, 100.f) == 100.f);  // folded into a larger running amax
  }
}

TEST_CASE("cuda FP8 GEMMs through cuBLASLt, fast and split accumulator, give k for ones", "[cuda][gpu][fp8]") {
  MT_GPU_OR_SKIP(gpu);
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, gpu.device()) == cudaSuccess);
  const bool fp8_cores = prop.major * 10 + prop.minor >= 89;
  for (const bool split : {false, true}) {
    INFO((split ? "split" : "fast") << " accumulator");
    // E4M3 ones times ones at unit scales: each output element is k, exact in bf16 for k = 256 or 4096.
    for (const std::int64_t k : {std::int64_t{256}, std::int64_t{4096}}) {
      Tensor c = gpu.empty(Shape{128, 64}, DType::bf16);
      auto call = gpu.fp8_gemm_call(128, 64, k, split, &c);
      if (!fp8_cores) {
        REQUIRE_FALSE(call.ok());
        CHECK_THAT(call.error().message(), Catch::Contains("no FP8 tensor cores"));
        continue;
      }
      REQUIRE(call.ok());
      (*call)();
      REQUIRE(gpu.synchronize().ok());
      CHECK(down(gpu, c) == Vec(128 * 64, static_cast<float>(k)));
    }
  }
}
