// The cuda backend's multi-tensor optimizer ops and its device-side
// init_normal against their references: foreach_adamw and
// foreach_sum_squares give the bits of the per-tensor calls they replace
// (one launch for the list instead of one or two per tensor), and
// init_normal draws on the device what the cpu backend draws on the host.
// Without a device each test prints "SKIPPED: no CUDA device" (ctest: Skipped).
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/cuda/cuda_test_util.h"

using namespace meshtrain;
using namespace meshtrain::cuda::testing;

namespace {

// Odd sizes around the kernels' block (256) and chunk (4096) boundaries.
const std::vector<std::int64_t> kSizes = {1, 7, 255, 257, 4095, 4097, 10007, 65537, 100003, 3};

// Sizes of a list longer than one launch's table (kernels::kMaxForeach = 256).
std::vector<std::int64_t> many_sizes() {
  std::vector<std::int64_t> s;
  for (std::int64_t k = 0; k < 300; ++k) s.push_back(k * 37 % 500 + 1);
  return s;
}

struct AdamWSet {
  std::vector<Tensor> p, g, m, v;
  std::vector<AdamWTensors> list() const {
    std::vector<AdamWTensors> out;
    for (std::size_t i = 0; i < p.size(); ++i)
      out.push_back({p[i], g[i], m[i], v[i], i % 3 == 0 ? 0.f : 0.01f * static_cast<float>(i)});
    return out;
  }
  Vec values(Backend& b) const {
    Vec out;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const Vec x = down_all(b, {&p[i], &m[i], &v[i]});
      out.insert(out.end(), x.begin(), x.end());
    }
    return out;
  }
};

AdamWSet adamw_set(Backend& b, const std::vector<std::int64_t>& sizes) {
  AdamWSet s;
  std::uint64_t seed = 900;
  for (std::int64_t n : sizes) {
    const Vec v = random_second_moment(static_cast<std::size_t>(n), seed + 3);
    s.p.push_back(up(b, {n}, random(static_cast<std::size_t>(n), seed)));
    s.g.push_back(up(b, {n}, random(static_cast<std::size_t>(n), seed + 1)));
    s.m.push_back(up(b, {n}, random(static_cast<std::size_t>(n), seed + 2, 0.1f)));
    s.v.push_back(up(b, {n}, v));
    seed += 4;
  }
  return s;
}

// Two steps, the first clipped (coef 0.5), the second not.
void steps(Backend& b, const AdamWSet& s, bool foreach) {
  AdamWOp op{1e-2f, 0.9f, 0.95f, 1e-8f, 0.f, 3};
  Tensor coef = up(b, {1}, Vec{0.5f});
  const Tensor* coefs[] = {&coef, nullptr};
  for (const Tensor* c : coefs) {
    const Tensor none;
    const Tensor& k = c ? *c : none;
    const std::vector<AdamWTensors> list = s.list();
    if (foreach) {
      b.foreach_adamw(list, k, op);
    } else {
      for (const AdamWTensors& t : list) {
        AdamWOp one = op;
        one.weight_decay = t.weight_decay;
        Tensor p = t.param, m = t.m, v = t.v;
        b.adamw(p, t.grad, m, v, k, one);
      }
    }
    ++op.step;
  }
}

}  // namespace

// The device update is the cpu's operation for operation (no FMA
// contraction), so it gives the cpu backend's bits too, and offloading the
// optimizer (which runs the cpu kernel on the host) changes nothing.
TEST_CASE("cuda foreach_adamw: one launch, the bits of per-tensor adamw and of the cpu backend", "[cuda][gpu]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  for (const auto& sizes : {kSizes, many_sizes()}) {
    INFO(sizes.size() << " tensors");
    const AdamWSet one = adamw_set(gpu, sizes), many = adamw_set(gpu, sizes), ref = adamw_set(cpu, sizes);
    steps(gpu, one, false);
    steps(gpu, many, true);
    steps(cpu, ref, true);
    const Vec per_tensor = one.values(gpu), foreach = many.values(gpu), want = ref.values(cpu);
    CHECK(foreach == per_tensor);
    expect_close(foreach, want, kF32, "foreach_adamw against the cpu backend");
    CHECK(foreach == want);
  }
}

TEST_CASE("cuda foreach_sum_squares: one pass, the bits of per-tensor sum_squares", "[cuda][gpu]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  for (const auto& sizes : {kSizes, many_sizes()}) {
    INFO(sizes.size() << " tensors");
    // Every third tensor bf16 on the gpu, as a 16-bit gradient; the cpu
    // reference sums the same (rounded) values in fp32 storage.
    auto tensors = [&](Backend& b, bool gpu_side) {
      std::vector<Tensor> xs;
      std::uint64_t seed = 950;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const bool half = i % 3 == 1;
        const Vec x = random(static_cast<std::size_t>(sizes[i]), seed++);
        xs.push_back(up(b, {sizes[i]}, half ? bf16_round(x) : x, half && gpu_side ? DType::bf16 : DType::f32));
      }
      return xs;
    };
    const std::vector<Tensor> gx = tensors(gpu, true), cx = tensors(cpu, false);
    Tensor per = up(gpu, {1}, Vec{2.5f}), all = up(gpu, {1}, Vec{2.5f}), ref = up(cpu, {1}, Vec{2.5f});
    for (const Tensor& x : gx) gpu.sum_squares(x, per, true);
    gpu.foreach_sum_squares(gx, all);
    cpu.foreach_sum_squares(cx, ref);
    const float p = down(gpu, per)[0], a = down(gpu, all)[0], r = down(cpu, ref)[0];
    CHECK(std::memcmp(&p, &a, sizeof p) == 0);
    INFO("gpu " << a << " cpu " << r);
    CHECK(std::abs(double(a) - r) <= 1e-6 * std::abs(double(r)));
  }
}

namespace {

// One init op over x (rows, cols) of several runs, with uncovered columns.
struct InitCase {
  std::int64_t rows, cols;
  NormalInitOp op;
};

std::vector<InitCase> init_cases() {
  std::vector<InitCase> cs;
  auto op = [](std::uint64_t key, double sd, std::int64_t cols, std::uint64_t stride,
               std::vector<NormalInitOp::Run> runs) {
    NormalInitOp o;
    o.key = key;
    o.stddev = sd;
    o.cols = cols;
    o.row_stride = stride;
    o.runs = std::move(runs);
    return o;
  };
  cs.push_back({5, 37, op(11, 1.0, 37, 37, {{0, 37, 100}})});
  // A tensor-parallel shard of a fused qkv: three runs of a wider row, padding between.
  cs.push_back({64, 96, op(12, 0.02, 96, 3000, {{3, 10, 5}, {20, 7, 1000}, {40, 50, 77}})});
  cs.push_back({1000, 130, op(13, 0.5, 130, 260, {{0, 64, 0}, {65, 65, 130}})});
  cs.push_back({1, 1 << 20, op(14, 0.02, 1 << 20, 0, {{0, 1 << 20, 12345678901ull}})});
  // More runs than one launch takes (kernels::kMaxNormalRuns = 64).
  std::vector<NormalInitOp::Run> runs;
  for (std::int64_t k = 0; k < 70; ++k) runs.push_back({2 * k + 1, 1, static_cast<std::uint64_t>(7 * k)});
  cs.push_back({33, 150, op(15, 2.0, 150, 500, std::move(runs))});
  cs.push_back({3, 8, op(16, 1.0, 8, 8, {})});  // no run: all zeros
  return cs;
}

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

// CUDA's double log and cos are within 1 ulp of exact, the C library's
// correctly rounded in practice; a 1-ulp difference in a double moves its
// fp32 rounding only when the double lies within an ulp of a midpoint
// between two floats (chance about 2^-29 per element), so the few hundred
// thousand draws here agree bit for bit (as on an H200 with CUDA 13.0).
// Should a CUDA version ever move one, `far` tells a 1-ulp rounding
// difference (that cause) from a real one (a wrong counter or run).
TEST_CASE("cuda init_normal: drawn on the device, the cpu backend's values", "[cuda][gpu]") {
  MT_GPU_OR_SKIP(gpu);
  CpuBackend cpu;
  for (const InitCase& c : init_cases()) {
    INFO("(" << c.rows << ", " << c.cols << ") with " << c.op.runs.size() << " runs");
    Tensor cx = cpu.empty({c.rows, c.cols});
    cpu.init_normal(cx, c.op);
    const Vec want = down(cpu, cx);
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      INFO(dtype_name(d));
      Tensor gx = up(gpu, {c.rows, c.cols}, Vec(want.size(), 9.f), d);  // every element is written
      gpu.init_normal(gx, c.op);
      const Vec got = down(gpu, gx), ref = round_to(want, d);
      std::size_t differ = 0, far = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        if (bits(got[i]) != bits(ref[i])) {
          ++differ;
          const std::int64_t ulps = std::abs(static_cast<std::int64_t>(bits(got[i])) - bits(ref[i]));
          if (d != DType::f32 || ulps > 1) ++far;
        }
      INFO(differ << " of " << got.size() << " differ");
      CHECK(far == 0);
      CHECK(differ == 0);
    }
  }
}
