// VqaLoader: deterministic visual questions over real images: each sample is
// a 2×2 grid of four 28×28 images of one split (the training set's, or the
// test set's: the split is by image) and a templated question about it with
// its one-word answer (engine/data/vqa_questions.h).
//
// Sample i (counted over the whole data-parallel group) takes the images at
// positions 4i .. 4i + 3 of ImageLoader's stream under the same seed (epoch
// permutations without replacement, so every image appears once per epoch
// of N/4 grids) and the question make_vqa_question draws from counter i of
// the seed's question stream. A sample is a pure function of (set, seed, i),
// so its position is the counter `draws` alone (LoaderState, saved in a
// checkpoint), and the data-parallel split is ImageLoader's: each next(B)
// consumes B·dp samples, rank r taking [r·B, (r+1)·B) of the block, so the
// rank batches concatenated in rank order are the dp = 1 batch.
//
// Evaluation (vqa_evaluation_batches) is the same stream over the test set
// under a fixed seed: its first N/4 questions see every test image once.
//
// Shape legend: B samples, S = 56 grid side, Q = question tokens.
//
// Thread-safety: one loader serves one thread (it caches a permutation).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/status.h"
#include "engine/data/data_loader.h"
#include "engine/data/image_dataset.h"
#include "engine/data/image_loader.h"
#include "engine/data/vqa_questions.h"

namespace meshtrain {

inline constexpr int kVqaCellSide = 28;                // one image of the grid
inline constexpr int kVqaGridSide = 2 * kVqaCellSide;  // S
inline constexpr std::uint64_t kVqaEvaluationSeed = 0x5651412d74657374;  // "VQA-test"

struct VqaSample {
  std::array<std::int64_t, 4> images{};  // indices into the set, by quadrant
  std::array<int, 4> labels{};
  VqaQuestion question;
};

struct VqaBatch {
  int rows = 0;                       // B
  std::vector<float> pixels;          // (B, S, S, 1) normalised
  std::vector<std::int32_t> ids;      // (B·Q) questions, left-padded
  std::vector<std::int32_t> answers;  // (B) answer word ids
};

class VqaLoader {
 public:
  // `set` is borrowed and must outlive the loader; its images must be 28×28
  // with one channel and its labels Fashion-MNIST's (check_vqa_images).
  // Questions are left-padded to `question_len` (at least kVqaQuestionTokens).
  VqaLoader(const ImageSet& set, const PixelStats& stats, std::uint64_t seed, int question_len, int dp_rank = 0,
            int dp = 1);

  // This rank's next `batch` samples.
  Result<VqaBatch> next(int batch);
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);

  // Global sample `index` (pure in the set, the seed and the index).
  VqaSample sample(std::uint64_t index);

 private:
  void append(VqaBatch& b, const VqaSample& s) const;

  const ImageSet* set_;
  std::vector<float> lut_;  // (256) normalised value of each byte
  int question_len_, dp_rank_, dp_;
  LoaderState state_;
  ImageLoader order_;  // the images' order: its image_of(), never its next()
};

// Whether `set` can make grids: 28×28 single-channel images with labels below 10.
Status check_vqa_images(const ImageSet& set);

// The fixed evaluation questions: the first min(max_questions, N/4) samples of
// the test set under kVqaEvaluationSeed, in batches of `batch` (the last may be short).
Result<std::vector<VqaBatch>> vqa_evaluation_batches(
    const ImageSet& set, const PixelStats& stats, int batch, int question_len,
    std::int64_t max_questions = std::numeric_limits<std::int64_t>::max());

// The share of `answers` that is the most frequent answer of `reference`:
// the majority-answer baseline's accuracy (its answer learnt on `reference`).
double majority_answer_accuracy(const std::vector<std::int32_t>& reference, const std::vector<std::int32_t>& answers);

}  // namespace meshtrain
