#include "engine/data/image_loader.h"

#include <algorithm>
#include <cassert>
#include <numeric>

namespace meshtrain {
namespace {

Status check_inputs(const ImageSet& set, const PixelStats& stats, int batch) {
  if (batch < 1) return make_error("the batch size must be positive, got {}", batch);
  if (set.count < 1 || set.pixels.size() != static_cast<std::size_t>(set.count) * set.image_size())
    return make_error("the image set '{}' holds no images; load it with load_image_dataset",
                      set.images_path);
  if (stats.mean.size() != static_cast<std::size_t>(set.channels) ||
      stats.std.size() != stats.mean.size()) {
    return make_error(
        "normalisation statistics have {} channel(s) but the images in '{}' have {}; compute "
        "them with pixel_stats of this dataset's training set",
        stats.mean.size(), set.images_path, set.channels);
  }
  return ok_status();
}

ImageBatch empty_batch(const ImageSet& set, int batch) {
  ImageBatch b;
  b.height = set.rows;
  b.width = set.cols;
  b.channels = set.channels;
  b.pixels.reserve(static_cast<std::size_t>(batch) * set.image_size());
  b.labels.reserve(batch);
  return b;
}

void append_image(ImageBatch& b, const ImageSet& set, const std::vector<float>& lut,
                  std::int64_t i) {
  const auto image = set.image(i);  // (H, W, C): the channel is the fastest index
  for (std::size_t p = 0; p < image.size(); ++p)
    b.pixels.push_back(lut[(p % set.channels) * 256 + image[p]]);
  b.labels.push_back(set.labels[i]);
  ++b.rows;
}

}  // namespace

std::vector<float> normalise_table(const PixelStats& stats) {
  std::vector<float> lut;
  for (std::size_t c = 0; c < stats.mean.size(); ++c)
    for (int v = 0; v < 256; ++v)
      lut.push_back(static_cast<float>((v / 255.0 - stats.mean[c]) / stats.std[c]));
  return lut;
}

std::vector<std::uint32_t> epoch_permutation(std::uint64_t seed, std::uint64_t epoch,
                                             std::int64_t count) {
  std::vector<std::uint32_t> perm(count);
  std::iota(perm.begin(), perm.end(), 0u);
  // Fisher–Yates from the back; epoch e takes counters e·N .. e·N + N - 1 of
  // the seed's stream, so epochs differ and none depends on another.
  const std::uint64_t base = epoch * static_cast<std::uint64_t>(count);
  for (std::int64_t j = count - 1; j > 0; --j) {
    const std::uint64_t k = uniform_draw(seed, base + j, static_cast<std::uint64_t>(j) + 1);
    std::swap(perm[j], perm[k]);
  }
  return perm;
}

ImageLoader::ImageLoader(const ImageSet& set, const PixelStats& stats, std::uint64_t seed,
                         int dp_rank, int dp)
    : set_(&set),
      stats_(stats),
      lut_(normalise_table(stats)),
      dp_rank_(dp_rank),
      dp_(dp),
      state_{seed, 0} {
  // The mesh hands out coordinates; a rank outside the group is a caller bug.
  assert(dp >= 1 && dp_rank >= 0 && dp_rank < dp);
}

std::uint64_t ImageLoader::epoch() const {
  return set_->count < 1 ? 0 : state_.draws / static_cast<std::uint64_t>(set_->count);
}

std::int64_t ImageLoader::image_of(std::uint64_t index) {
  assert(set_->count > 0);  // next() refuses an empty set before asking
  const auto n = static_cast<std::uint64_t>(set_->count);
  const std::uint64_t e = index / n;
  if (e != perm_epoch_ || state_.seed != perm_seed_) {
    perm_ = epoch_permutation(state_.seed, e, set_->count);
    perm_epoch_ = e;
    perm_seed_ = state_.seed;
  }
  return perm_[index % n];
}

Result<ImageBatch> ImageLoader::next(int batch) {
  MT_TRY(check_inputs(*set_, stats_, batch));
  ImageBatch b = empty_batch(*set_, batch);
  const std::uint64_t first = state_.draws + static_cast<std::uint64_t>(dp_rank_) * batch;
  for (int i = 0; i < batch; ++i) append_image(b, *set_, lut_, image_of(first + i));
  state_.draws += static_cast<std::uint64_t>(batch) * dp_;
  return b;
}

Result<std::vector<ImageBatch>> evaluation_batches(const ImageSet& set, const PixelStats& stats,
                                                   int batch, std::int64_t max_images) {
  MT_TRY(check_inputs(set, stats, batch));
  if (max_images < 1) return make_error("evaluation needs at least one image, got {}", max_images);
  const std::vector<float> lut = normalise_table(stats);
  const std::int64_t count = std::min(set.count, max_images);
  std::vector<ImageBatch> out;
  for (std::int64_t i = 0; i < count; ++i) {
    if (i % batch == 0)
      out.push_back(empty_batch(set, static_cast<int>(std::min<std::int64_t>(batch, count - i))));
    append_image(out.back(), set, lut, i);
  }
  return out;
}

}  // namespace meshtrain
