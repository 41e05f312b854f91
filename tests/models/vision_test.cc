// ViT and Swin: parameter counts and FLOPs against counts derived here from
// the papers' layer lists (independently of the block code), the index maps
// of window attention and patch merging, and gradients against finite
// differences of the loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "models/parameters.h"
#include "models/transformer_layer.h"
#include "tests/models/directional_derivatives.h"
#include "models/vision_blocks.h"
#include "tests/models/image_model_fixture.h"

using namespace meshtrain;

namespace {

// ViT (Dosovitskiy et al. 2021, eq. 1-4): patch projection with bias, class
// token, positions, L × (LN, QKV + bias, projection + bias, LN, MLP with
// biases), final LN, head with bias.
double vit_parameters(double L, double C, double F, double P, double K, double S, double Y) {
  const double layer = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C);
  return (P * P * K * C + C) + C + (1 + S * S) * C + L * layer + 2 * C + (C * Y + Y);
}

// Swin (Liu et al. 2021, Sec. 3): patch projection with bias and its LN;
// per block of width C with h heads: the ViT layer's parameters (MLP ratio 4)
// and a (2M - 1)² × h relative position table; between stages a merge (LN
// over 4C, 4C -> 2C without bias); final LN, head.
double swin_parameters(double C0, const std::vector<int>& depths, const std::vector<int>& heads, double P, double K,
                       double M, double Y) {
  double total = P * P * K * C0 + C0 + 2 * C0, C = C0;
  for (std::size_t i = 0; i < depths.size(); ++i) {
    if (i > 0) {
      total += 2 * 4 * C + 4 * C * 2 * C;
      C *= 2;
    }
    const double block = 4 * C + 4 * C * C + 4 * C + 8 * C * C + 5 * C + (2 * M - 1) * (2 * M - 1) * heads[i];
    total += depths[i] * block;
  }
  return total + 2 * C + C * Y + Y;
}

std::int64_t count(const std::string& name) { return count_parameters(*model_preset(name)).total; }

}  // namespace

TEST_CASE("ViT and Swin parameter counts match the published models", "[vision]") {
  CHECK(count("vit-b16") == 86'567'656);  // timm's vit_base_patch16_224
  CHECK(count("vit-b16") == vit_parameters(12, 768, 3072, 16, 3, 14, 1000));
  CHECK(count("vit-l16") == vit_parameters(24, 1024, 4096, 16, 3, 14, 1000));
  CHECK(count("vit-h14") == vit_parameters(32, 1280, 5120, 14, 3, 16, 1000));
  CHECK(count("swin-t") == 28'288'354);  // timm's swin_tiny_patch4_window7_224
  CHECK(count("swin-t") == swin_parameters(96, {2, 2, 6, 2}, {3, 6, 12, 24}, 4, 3, 7, 1000));
  CHECK(count("swin-s") == swin_parameters(96, {2, 2, 18, 2}, {3, 6, 12, 24}, 4, 3, 7, 1000));
  CHECK(count("swin-b") == swin_parameters(128, {2, 2, 18, 2}, {4, 8, 16, 32}, 4, 3, 7, 1000));
  CHECK(count("swin-l") == swin_parameters(192, {2, 2, 18, 2}, {6, 12, 24, 48}, 4, 3, 7, 1000));
  // Published totals, rounded (Liu et al. 2021, Table 1; Dosovitskiy et al. Table 1).
  CHECK(count("swin-b") / 1e6 == Approx(88).margin(0.5));
  CHECK(count("swin-l") / 1e6 == Approx(197).margin(0.5));
  CHECK(count("vit-l16") / 1e6 == Approx(307).margin(3));
  CHECK(count("vit-h14") / 1e6 == Approx(632).margin(3));
}

TEST_CASE("FLOPs per image follow an independent count of GEMMs and attention", "[vision][flops]") {
  SECTION("ViT-B/16") {
    const ModelSpec m = *model_preset("vit-b16");
    const double T = 197, C = 768, F = 3072, S = 14;
    const double layer = 2 * T * (4 * C * C + 2 * C * F) + 2 * (2 * T * T * C);
    const double expected = 2 * S * S * (16 * 16 * 3) * C + 12 * layer + 2 * C * 1000;
    CHECK(forward_flops(m, 1, m.seq_len).total() == Approx(expected).epsilon(1e-12));
    // 17.6 GFLOPs (multiply-adds) in Dosovitskiy et al.'s count.
    CHECK(forward_flops(m, 1, m.seq_len).total() / 2 / 1e9 == Approx(17.6).epsilon(0.01));
  }
  SECTION("Swin-T") {
    const ModelSpec m = *model_preset("swin-t");
    double expected = 2 * 56.0 * 56 * (4 * 4 * 3) * 96, C = 96, grid = 56;
    const int depths[4] = {2, 2, 6, 2};
    for (int i = 0; i < 4; ++i) {
      if (i > 0) {
        grid /= 2;
        expected += 2 * grid * grid * (4 * C) * (2 * C);
        C *= 2;
      }
      const double T = grid * grid;
      expected += depths[i] * (2 * T * (4 * C * C + 8 * C * C) + 2 * (2 * T * 49 * C));
    }
    expected += 2 * C * 1000;
    const ForwardFlops f = forward_flops(m, 1, m.seq_len);
    CHECK(f.total() == Approx(expected).epsilon(1e-12));
    // 4.5 G multiply-adds (Liu et al. 2021, Table 1).
    CHECK(f.total() / 2 / 1e9 == Approx(4.5).epsilon(0.03));
    CHECK(training_flops(m, 8, m.seq_len, Recompute::none).per_token == Approx(3 * expected));
  }
}

TEST_CASE("window partition, shift and merge are permutations with the reference layout", "[vision]") {
  const int B = 2, grid = 6, M = 3, shift = 1;
  const auto order = window_order(B, grid, M, shift);
  REQUIRE(order.size() == static_cast<std::size_t>(B * grid * grid));
  CHECK(std::set<std::int32_t>(order.begin(), order.end()).size() == order.size());
  const auto inverse = inverse_order(order);
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(inverse[static_cast<std::size_t>(order[i])] == int(i));
  // torch.roll(x, (-1, -1)) then window (0, 0) starts at image position (1, 1);
  // the last window's last token wraps to (0, 0).
  CHECK(order[0] == 1 * grid + 1);
  CHECK(order[grid * grid - 1] == 0);
  CHECK(order[grid * grid] == grid * grid + grid + 1);  // image 1
  // The unshifted partition: window (0, 1), token (0, 0) is image position (0, 3).
  CHECK(window_order(1, grid, M, 0)[9] == 3);

  const auto mask = shifted_window_mask(grid, M, shift);
  REQUIRE(mask.size() == 4u * 9 * 9);
  // Window 0 lies inside region 0 of the shifted image: nothing masked.
  CHECK(std::all_of(mask.begin(), mask.begin() + 81, [](float v) { return v == 0.f; }));
  // Window 3 (bottom right) mixes four regions: token 0 and token 8 (the wrapped corner) may not meet.
  CHECK(mask[3 * 81 + 0 * 9 + 8] < -50.f);
  CHECK(mask[3 * 81 + 0 * 9 + 0] == 0.f);

  const auto rel = relative_position_index(M);
  CHECK(*std::min_element(rel.begin(), rel.end()) == 0);
  CHECK(*std::max_element(rel.begin(), rel.end()) == (2 * M - 1) * (2 * M - 1) - 1);
  CHECK(rel[0] == (M - 1) * (2 * M - 1) + (M - 1));  // a token and itself: offset (0, 0)

  // Merging a 3×3 grid pads to 4×4: row (0, 0)'s four are (0,0), (1,0), (0,1), (1,1).
  const auto merge = merge_order(1, 3);
  REQUIRE(merge.size() == 16u);
  CHECK(std::vector<std::int32_t>(merge.begin(), merge.begin() + 4) == std::vector<std::int32_t>{0, 3, 1, 4});
  CHECK(merge[4 * 3 + 3] == -1);  // merged row (1, 1) takes (3, 3): padding
  CHECK(std::count(merge.begin(), merge.end(), -1) == 7);
  const auto patches = patch_order(1, 4, 2);
  CHECK(std::vector<std::int32_t>(patches.begin(), patches.begin() + 4) == std::vector<std::int32_t>{0, 1, 4, 5});
}

namespace {

using VisionFixture = testing::ImageModelFixture;

void check_gradient(const ModelSpec& spec) { testing::check_image_model_gradient(spec, 11, 4); }

}  // namespace

TEST_CASE("the vision models' loss at initialisation is close to ln(classes)", "[vision]") {
  for (const char* name : {"vit-tiny", "swin-micro"}) {
    INFO(name);
    VisionFixture f(*model_preset(name), 1, 8);
    CHECK(f.loss() == Approx(std::log(10.0)).margin(0.1));
  }
}

TEST_CASE("ViT gradients match finite differences of the loss", "[vision]") { check_gradient(*model_preset("vit-tiny")); }

TEST_CASE("Swin gradients match finite differences of the loss", "[vision]") {
  // swin-micro: a 6×6 grid in windows of 3 (shifted on the second block, so
  // masked), a 3×3 grid merged with padding, and relative position tables.
  check_gradient(*model_preset("swin-micro"));
}

TEST_CASE("full recomputation of Swin blocks gives the same gradient bits", "[vision]") {
  const ModelSpec m = *model_preset("swin-micro");
  VisionFixture plain(m, 3, 4), recompute(m, 3, 4, ChunkOptions{Recompute::full, 0.f});
  CHECK(recompute.gradient() == plain.gradient());
}
