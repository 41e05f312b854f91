// An FP8 linear (models/fp8_linear.h) against values derived by hand: its
// GEMMs are the fp32 GEMMs of the operands rounded to E4M3 (forward) and
// E5M2 (the output gradient), first with scale 1 (no step recorded yet),
// then with the scales the first step's amax set (fp8_max / amax).
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "models/block_context.h"
#include "models/fp8_linear.h"
#include "models/parameter_store.h"

using namespace meshtrain;

namespace {

std::vector<float> read(CpuBackend& b, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  REQUIRE(b.read(t, out).ok());
  return out;
}

}  // namespace

TEST_CASE("an FP8 linear's GEMMs are the fp32 GEMMs of its FP8-rounded operands", "[fp8]") {
  CpuBackend b(CpuBackendOptions{1});
  const ModelSpec m = *model_preset("tiny");
  ParamTableBuilder table(0);
  table.linear("lin", 2, 1, TpSplit::column, false);  // W (2, 1): y = x · W
  const std::vector<ParamInfo> infos = table.take();
  ParameterStore store(b, m, infos, ShardCoord{0, 1, 0, 1});
  Tensor w = store["lin.weight"].value;
  b.write(w, std::vector<float>{0.7f, -2.6f});
  Fp8Scaling scaling(b, infos);
  BlockContext ctx(b, m, store, TensorParallel{Group{0, {0}}, 0, 1}, ChunkOptions{});
  ctx.fp8 = &scaling;
  Tensor x = b.empty(Shape{1, 2});
  b.write(x, std::vector<float>{1.1f, -0.3f});

  // Scale 1. E4M3 has 3 mantissa bits: 1.1 -> 1.125 (spacing 1/8 in [1, 2)), -0.3 -> -0.3125
  // (1/32 in [1/4, 1/2)), 0.7 -> 0.6875 (1/16 in [1/2, 1)), -2.6 -> -2.5 (1/4 in [2, 4)).
  Tensor y;
  ctx.linear("lin", x, y, LinearKind::column);
  CHECK(read(b, y) == std::vector<float>{1.125f * 0.6875f + 0.3125f * 2.5f});  // 1.5546875; fp32 gives 1.55
  // Backward, dy = 0.3 as E5M2 (2 mantissa bits, spacing 1/16 in [1/4, 1/2)): 0.3125.
  // dx = dy_q · W_qᵀ, dW = x_qᵀ · dy_q, each exact in fp32.
  Tensor dy = b.empty(Shape{1, 1}), dx;
  b.write(dy, std::vector<float>{0.3f});
  ctx.linear_backward("lin", x, dy, &dx, LinearKind::column);
  CHECK(read(b, dx) == std::vector<float>{0.3125f * 0.6875f, 0.3125f * -2.5f});
  CHECK(read(b, store["lin.weight"].grad) == std::vector<float>{1.125f * 0.3125f, -0.3125f * 0.3125f});

  // The step's amax per tensor (input, weight, gradient), then the next step's scales fp8_max / amax.
  CHECK(*scaling.step_amax() == std::vector<float>{1.1f, 2.6f, 0.3f});
  REQUIRE(scaling.end_step(*scaling.step_amax()).ok());
  const float sx = 448.f / 1.1f, sw = 448.f / 2.6f;
  CHECK(scaling.scale("lin", Fp8Operand::input) == sx);
  CHECK(scaling.scale("lin", Fp8Operand::weight) == sw);
  CHECK(scaling.scale("lin", Fp8Operand::grad) == 57344.f / 0.3f);
  CHECK(*scaling.step_amax() == std::vector<float>{0, 0, 0});
  // Scaled: the largest values land on 448 (1.1 and -2.6 back exactly, up to fp32's rounding of the
  // scale); -0.3·sx = -122.2 -> -120 and 0.7·sw = 120.6 -> 120 (E4M3 spacing 8 in [64, 128)), so
  // y = 1.1 · 120/sw + (120/sx) · 2.6 = 2 · 120 · 1.1 · 2.6 / 448.
  ctx.linear("lin", x, y, LinearKind::column);
  CHECK(read(b, y)[0] == Approx(2.0 * 120 * 1.1 * 2.6 / 448).epsilon(1e-6));
}

TEST_CASE("FP8 current scaling takes each tensor's scale from its own amax, from the first cast", "[fp8]") {
  CpuBackend b(CpuBackendOptions{1});
  const ModelSpec m = *model_preset("tiny");
  ParamTableBuilder table(0);
  table.linear("lin", 2, 1, TpSplit::column, false);
  const std::vector<ParamInfo> infos = table.take();
  ParameterStore store(b, m, infos, ShardCoord{0, 1, 0, 1});
  Tensor w = store["lin.weight"].value;
  b.write(w, std::vector<float>{0.7f, -2.6f});
  Fp8Scaling scaling(b, infos, Fp8Recipe::current);
  BlockContext ctx(b, m, store, TensorParallel{Group{0, {0}}, 0, 1}, ChunkOptions{});
  ctx.fp8 = &scaling;
  Tensor x = b.empty(Shape{1, 2});
  b.write(x, std::vector<float>{1.1f, -0.3f});
  // sx = 448/1.1, sw = 448/2.6 already in the first step (delayed scaling starts at 1): the
  // largest values come back exactly; -0.3·sx = -122.2 -> -120 and 0.7·sw = 120.6 -> 120.
  const double sx = 448.0 / 1.1, sw = 448.0 / 2.6;
  Tensor y;
  ctx.linear("lin", x, y, LinearKind::column);
  CHECK(read(b, y)[0] == Approx(2.0 * 120 * 1.1 * 2.6 / 448).epsilon(1e-6));
  // dy = 0.3 is its own amax: 0.3 · 57344/0.3 lands on E5M2's largest value and comes back.
  Tensor dy = b.empty(Shape{1, 1}), dx;
  b.write(dy, std::vector<float>{0.3f});
  ctx.linear_backward("lin", x, dy, &dx, LinearKind::column);
  const std::vector<float> dxv = read(b, dx);
  CHECK(dxv[0] == Approx(0.3 * 120 / sw).epsilon(1e-6));
  CHECK(dxv[1] == Approx(0.3 * -2.6).epsilon(1e-6));
  const std::vector<float> dw = read(b, store["lin.weight"].grad);
  CHECK(dw[0] == Approx(1.1 * 0.3).epsilon(1e-6));
  CHECK(dw[1] == Approx(-120 / sx * 0.3).epsilon(1e-6));
  // Nothing is recorded for later steps, and a checkpoint keeps nothing.
  CHECK_FALSE(scaling.amax().defined());
}

TEST_CASE("current_scale follows Transformer Engine's compute_scale_from_amax", "[fp8]") {
  CHECK(current_scale(2.f, Fp8Format::e4m3) == 224.f);
  CHECK(current_scale(-2.f, Fp8Format::e5m2) == 28672.f);
  CHECK(current_scale(0.f, Fp8Format::e4m3) == 1.f);  // an all-zero tensor
  CHECK(current_scale(std::numeric_limits<float>::infinity(), Fp8Format::e4m3) == 1.f);
  CHECK(current_scale(std::numeric_limits<float>::quiet_NaN(), Fp8Format::e4m3) == 1.f);
  // 448 / 2e-38 overflows fp32: the largest float instead.
  CHECK(current_scale(2e-38f, Fp8Format::e4m3) == std::numeric_limits<float>::max());
}

TEST_CASE("FP8 scaling state round-trips and refuses what no history holds", "[fp8]") {
  ParamTableBuilder table(0);
  table.linear("a", 4, 4, TpSplit::row, true);
  table.linear("b", 4, 4, TpSplit::replicated, false);  // not FP8: a replicated linear stays fp32
  const std::vector<ParamInfo> infos = table.take();
  CpuBackend b(CpuBackendOptions{1});
  Fp8Scaling s(b, infos, Fp8Recipe::delayed, 4);
  CHECK(s.linears() == std::vector<std::string>{"a"});
  REQUIRE(s.end_step(std::vector<float>{2.f, 0.5f, 8.f}).ok());
  REQUIRE(s.end_step(std::vector<float>{1.f, 0.25f, 16.f}).ok());
  const std::vector<float> state = s.state("a");
  // Per tensor: the scale from the history's max, then the history oldest first (two steps, two empty).
  CHECK(state == std::vector<float>{224.f, 0, 0, 2.f, 1.f, 896.f, 0, 0, 0.5f, 0.25f, 3584.f, 0, 0, 8.f, 16.f});
  Fp8Scaling t(b, infos, Fp8Recipe::delayed, 4);
  REQUIRE(t.restore("a", state).ok());
  CHECK(t.state("a") == state);
  // Two more steps push the oldest out in the same order on both.
  for (Fp8Scaling* u : {&s, &t}) REQUIRE(u->end_step(std::vector<float>{0.1f, 0.1f, 0.1f}).ok());
  CHECK(t.state("a") == s.state("a"));

  const Status short_state = t.restore("a", std::vector<float>(3, 1.f));
  REQUIRE_FALSE(short_state.ok());
  CHECK_THAT(short_state.error().message(), Catch::Contains("linear 'a' has 3 values; this recipe keeps 15"));
  std::vector<float> negative = state;
  negative[2] = -1.f;
  const Status bad = t.restore("a", negative);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("amax -1 is not a finite number >= 0"));
  std::vector<float> zero_scale = state;
  zero_scale[0] = 0.f;
  const Status no_scale = t.restore("a", zero_scale);
  REQUIRE_FALSE(no_scale.ok());
  CHECK_THAT(no_scale.error().message(), Catch::Contains("scale 0 is not a finite positive number"));
  CHECK_FALSE(t.end_step(std::vector<float>{1.f}).ok());
}
