#include "engine/data/image_loader.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "error_of.h"

using namespace meshtrain;
using meshtrain::testing::error_of;

namespace {
constexpr std::uint64_t kSeed = 4321;

// n images of 2×3 with `channels` channels (n <= 256): every byte of image i
// is i and its label is i mod classes, so a batch row names its image.
ImageSet numbered_set(int n, int channels = 1, int classes = 10) {
  ImageSet s;
  s.count = n;
  s.rows = 2;
  s.cols = 3;
  s.channels = channels;
  s.classes = classes;
  s.images_path = "numbered";
  for (int i = 0; i < n; ++i) {
    s.pixels.insert(s.pixels.end(), s.image_size(), static_cast<std::uint8_t>(i));
    s.labels.push_back(static_cast<std::uint8_t>(i % classes));
  }
  return s;
}

// Normalising with mean 0 and std 1 leaves x/255, from which the image number is read back.
PixelStats identity_stats(int channels = 1) {
  return {std::vector<double>(channels, 0.0), std::vector<double>(channels, 1.0)};
}

ImageBatch next_ok(ImageLoader& l, int batch) {
  auto b = l.next(batch);
  REQUIRE(b.ok());
  return std::move(b).value();
}

// The image number of each row of a batch of numbered_set images.
std::vector<int> images_in(const ImageBatch& b) {
  const std::size_t per_image = static_cast<std::size_t>(b.height) * b.width * b.channels;
  std::vector<int> out;
  for (int r = 0; r < b.rows; ++r)
    out.push_back(static_cast<int>(std::lround(b.pixels[r * per_image] * 255)));
  return out;
}
}  // namespace

TEST_CASE("image batches are (B, H, W, C) normalised pixels with int32 labels", "[image-loader]") {
  INFO("seed " << kSeed);
  const ImageSet set = numbered_set(20, /*channels=*/2);
  const PixelStats stats{{0.25, 0.5}, {0.5, 0.125}};
  ImageLoader loader(set, stats, kSeed);
  const ImageBatch b = next_ok(loader, 3);
  CHECK(b.rows == 3);
  CHECK(b.height == 2);
  CHECK(b.width == 3);
  CHECK(b.channels == 2);
  REQUIRE(b.pixels.size() == 3u * 2 * 3 * 2);
  REQUIRE(b.labels.size() == 3);
  for (int r = 0; r < 3; ++r) {
    const std::int64_t image = loader.image_of(static_cast<std::uint64_t>(r));
    CHECK(b.labels[r] == set.labels[image]);
    for (int p = 0; p < 2 * 3 * 2; ++p) {
      const int c = p % 2;  // channels are the fastest index
      const double x = set.image(image)[p] / 255.0;
      CHECK(b.pixels[r * 12 + p] == Approx((x - stats.mean[c]) / stats.std[c]));
    }
  }
  CHECK(loader.state().draws == 3);
}

TEST_CASE("each epoch visits every image exactly once", "[image-loader]") {
  INFO("seed " << kSeed);
  constexpr int kN = 37;
  const ImageSet set = numbered_set(kN);
  ImageLoader loader(set, identity_stats(), kSeed);
  std::vector<int> seen;
  // 5 does not divide 37, so batches straddle epoch boundaries.
  while (seen.size() < 3 * kN + 4) {
    const auto images = images_in(next_ok(loader, 5));
    seen.insert(seen.end(), images.begin(), images.end());
  }
  std::vector<int> all(kN);
  std::iota(all.begin(), all.end(), 0);
  for (int e = 0; e < 3; ++e) {
    INFO("epoch " << e);
    std::vector<int> epoch(seen.begin() + e * kN, seen.begin() + (e + 1) * kN);
    const auto perm = epoch_permutation(kSeed, e, kN);
    CHECK(epoch == std::vector<int>(perm.begin(), perm.end()));
    std::sort(epoch.begin(), epoch.end());
    CHECK(epoch == all);
  }
  CHECK(loader.epoch() == 3);
  // Epochs are shuffled apart: not the file order and not each other's order.
  CHECK(epoch_permutation(kSeed, 0, kN) != epoch_permutation(kSeed, 1, kN));
  CHECK(epoch_permutation(kSeed, 0, kN) != std::vector<std::uint32_t>(all.begin(), all.end()));
  CHECK(epoch_permutation(kSeed, 0, 1) == std::vector<std::uint32_t>{0});
}

TEST_CASE("the same seed gives the same image batches, another seed others", "[image-loader]") {
  INFO("seed " << kSeed);
  const ImageSet set = numbered_set(200);
  ImageLoader a(set, identity_stats(), kSeed), b(set, identity_stats(), kSeed),
      c(set, identity_stats(), kSeed + 1);
  for (int i = 0; i < 5; ++i) {
    const ImageBatch ba = next_ok(a, 8);
    const ImageBatch bb = next_ok(b, 8);
    CHECK(ba.pixels == bb.pixels);
    CHECK(ba.labels == bb.labels);
    CHECK(images_in(ba) != images_in(next_ok(c, 8)));
  }
  // The permutation is a pure function of (seed, epoch).
  CHECK(epoch_permutation(kSeed, 7, 200) == epoch_permutation(kSeed, 7, 200));
}

TEST_CASE("data-parallel ranks split the global image batch in rank order", "[image-loader]") {
  INFO("seed " << kSeed);
  constexpr int kDp = 3, kB = 2;
  const ImageSet set = numbered_set(17);  // 6 draws a step: epochs end mid-step
  ImageLoader single(set, identity_stats(), kSeed);
  std::vector<ImageLoader> ranks;
  for (int r = 0; r < kDp; ++r) ranks.emplace_back(set, identity_stats(), kSeed, r, kDp);
  for (int step = 0; step < 8; ++step) {
    const ImageBatch global = next_ok(single, kB * kDp);
    std::vector<float> pixels;
    std::vector<std::int32_t> labels;
    for (int r = 0; r < kDp; ++r) {
      const ImageBatch b = next_ok(ranks[r], kB);
      pixels.insert(pixels.end(), b.pixels.begin(), b.pixels.end());
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
    }
    // Rank r holds rows [r·B, (r+1)·B) of the dp=1 batch.
    CHECK(pixels == global.pixels);
    CHECK(labels == global.labels);
    for (const auto& r : ranks) CHECK(r.state() == single.state());
  }
}

TEST_CASE("a restored image-loader state resumes the same batches, under any dp",
          "[image-loader]") {
  INFO("seed " << kSeed);
  const ImageSet set = numbered_set(23);
  ImageLoader run(set, identity_stats(), kSeed);
  for (int i = 0; i < 5; ++i) next_ok(run, 4);  // 20 draws: into the middle of epoch 0
  const std::string saved = loader_state_to_json(run.state()).dump();
  auto state = loader_state_from_json(nlohmann::json::parse(saved));
  REQUIRE(state.ok());
  CHECK(*state == run.state());

  ImageLoader resumed(set, identity_stats(), /*seed=*/999);  // the seed comes from the state
  resumed.restore(*state);
  // The same global batch of 4 split over dp = 2 after the restore.
  ImageLoader rank0(set, identity_stats(), 999, 0, 2), rank1(set, identity_stats(), 999, 1, 2);
  rank0.restore(*state);
  rank1.restore(*state);
  for (int i = 0; i < 4; ++i) {
    const ImageBatch expected = next_ok(run, 4);
    CHECK(next_ok(resumed, 4).pixels == expected.pixels);
    auto halves = images_in(next_ok(rank0, 2));
    const auto second = images_in(next_ok(rank1, 2));
    halves.insert(halves.end(), second.begin(), second.end());
    CHECK(halves == images_in(expected));
  }
}

TEST_CASE("image loader inputs are checked", "[image-loader]") {
  const ImageSet set = numbered_set(4);
  ImageLoader loader(set, identity_stats(), kSeed);
  CHECK_THAT(error_of(loader.next(0)), Catch::Contains("batch size must be positive"));
  ImageLoader rgb(set, identity_stats(3), kSeed);
  CHECK_THAT(error_of(rgb.next(2)),
             Catch::Contains("normalisation statistics have 3 channel(s) but the images in "
                             "'numbered' have 1"));
  const ImageSet empty;
  ImageLoader none(empty, identity_stats(), kSeed);
  CHECK_THAT(error_of(none.next(1)), Catch::Contains("holds no images"));
  CHECK_THAT(error_of(evaluation_batches(set, identity_stats(), 2, 0)),
             Catch::Contains("at least one image"));
}

TEST_CASE("evaluation batches are the first images in file order", "[image-loader]") {
  const ImageSet set = numbered_set(10);
  auto first7 = evaluation_batches(set, identity_stats(), 3, 7);
  REQUIRE(first7.ok());
  REQUIRE(first7->size() == 3);  // 3 + 3 + 1
  CHECK(images_in((*first7)[0]) == std::vector<int>{0, 1, 2});
  CHECK(images_in((*first7)[2]) == std::vector<int>{6});
  CHECK((*first7)[2].labels == std::vector<std::int32_t>{6});

  auto all = evaluation_batches(set, identity_stats(), 4);
  REQUIRE(all.ok());
  std::vector<int> images;
  for (const ImageBatch& b : *all) {
    const auto in = images_in(b);
    images.insert(images.end(), in.begin(), in.end());
  }
  std::vector<int> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(images == expected);
  // The same call twice gives the same batches: evaluation figures compare across steps.
  CHECK(evaluation_batches(set, identity_stats(), 4)->back().pixels == all->back().pixels);
}
