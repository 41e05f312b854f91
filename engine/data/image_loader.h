// ImageLoader: deterministic batches of images, sampled in epochs without
// replacement.
//
// Draw i (counted over the whole data-parallel group) is image
// perm_{seed, e}(i mod N) of epoch e = i / N, where perm_{seed, e} is a
// Fisher–Yates shuffle of 0..N-1 driven by the counter-based stream of
// `seed` (the same uniform_draw DataLoader uses), counters e·N .. e·N + N - 1.
// The permutation is a pure function of (seed, epoch), so a draw index names
// one image whatever dp is, and every image appears once per epoch. The
// loader's whole position is the counter `draws` (LoaderState, saved in a
// checkpoint as DataLoader's is); `restore` puts it back.
//
// Data parallelism is DataLoader's: each next(B) consumes B·dp draws and the
// loader of data-parallel rank r takes draws [r·B, (r+1)·B) of that block, so
// the rank batches concatenated in rank order are exactly the batch of B·dp
// rows a dp=1 loader returns, and all ranks hold the same `draws` afterwards.
// A batch may straddle two epochs.
//
// Pixels are normalised per channel, (x/255 − mean_c)/std_c, with the
// training set's PixelStats (also for the test set, as models expect).
//
// Shape legend: B batch rows, H rows, W columns, C channels of an image.
//
// Thread-safety: a loader caches the current epoch's permutation, so one
// loader serves one thread (each rank thread builds its own; they agree).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "core/status.h"
#include "engine/data/data_loader.h"
#include "engine/data/image_dataset.h"

namespace meshtrain {

struct ImageBatch {
  int rows = 0;                      // B
  int height = 0;                    // H
  int width = 0;                     // W
  int channels = 0;                  // C
  std::vector<float> pixels;         // (B, H, W, C) row-major, normalised
  std::vector<std::int32_t> labels;  // (B), in [0, classes)
};

// The order of epoch `epoch` under `seed`: perm[j] is the image at position j
// of the epoch. Pure; exposed so tests and tools can see which images a run
// used. (count)
std::vector<std::uint32_t> epoch_permutation(std::uint64_t seed, std::uint64_t epoch,
                                             std::int64_t count);

// (C, 256): every byte's normalised value per channel, (v/255 − mean_c)/std_c,
// so a batch costs one lookup per pixel.
std::vector<float> normalise_table(const PixelStats& stats);

class ImageLoader {
 public:
  // `set` is borrowed: it must outlive the loader. `stats` is copied (C).
  ImageLoader(const ImageSet& set, const PixelStats& stats, std::uint64_t seed, int dp_rank = 0,
              int dp = 1);

  // This rank's next `batch` images. Errors if batch < 1, the set is empty or
  // `stats` has another channel count than the set.
  Result<ImageBatch> next(int batch);

  LoaderState state() const { return state_; }
  void restore(const LoaderState& s) { state_ = s; }
  // The epoch the next draw falls in.
  std::uint64_t epoch() const;

  // The image global draw `index` takes (caches that epoch's permutation).
  // The set must not be empty.
  std::int64_t image_of(std::uint64_t index);

 private:
  const ImageSet* set_;
  PixelStats stats_;
  std::vector<float> lut_;  // (C, 256): normalised value of each byte per channel
  int dp_rank_;
  int dp_;
  LoaderState state_;
  // The permutation of (perm_seed_, perm_epoch_), rebuilt when either changes.
  std::uint64_t perm_seed_ = 0;
  std::uint64_t perm_epoch_ = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint32_t> perm_;  // (N)
};

// The fixed evaluation set: the first min(count, max_images) images of `set`
// in file order, grouped into batches of `batch` rows (the last may have
// fewer; weigh the loss per image). The same call gives the same batches, so
// evaluation figures compare across steps. Normalised with `stats`, the
// training set's.
Result<std::vector<ImageBatch>> evaluation_batches(
    const ImageSet& set, const PixelStats& stats, int batch,
    std::int64_t max_images = std::numeric_limits<std::int64_t>::max());

}  // namespace meshtrain
