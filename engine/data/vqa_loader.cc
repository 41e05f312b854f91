#include "engine/data/vqa_loader.h"

#include <algorithm>
#include <cassert>
#include <map>

#include "models/init.h"

namespace meshtrain {

namespace {

// The question stream of a seed: apart from the image order's counters.
std::uint64_t question_seed(std::uint64_t seed) { return mix64(seed ^ 0x7175657374696f6eULL); }  // "question"

}  // namespace

VqaLoader::VqaLoader(const ImageSet& set, const PixelStats& stats, std::uint64_t seed, int question_len,
                     int dp_rank, int dp)
    : set_(&set),
      lut_(normalise_table(stats)),
      question_len_(question_len),
      dp_rank_(dp_rank),
      dp_(dp),
      state_{seed, 0},
      order_(set, stats, seed) {
  assert(dp >= 1 && dp_rank >= 0 && dp_rank < dp);
  assert(question_len >= kVqaQuestionTokens);
}

void VqaLoader::restore(const LoaderState& s) {
  state_ = s;
  order_.restore({s.seed, 0});  // its seed picks the permutations
}

VqaSample VqaLoader::sample(std::uint64_t index) {
  VqaSample s;
  for (std::size_t k = 0; k < 4; ++k) {
    s.images[k] = order_.image_of(4 * index + k);
    s.labels[k] = set_->labels[static_cast<std::size_t>(s.images[k])];
  }
  s.question = make_vqa_question(s.labels, uniform_draw(question_seed(state_.seed), index, kVqaQuestionDraws));
  return s;
}

void VqaLoader::append(VqaBatch& b, const VqaSample& s) const {
  // (S, S) grid rows: quadrant q covers rows 28·(q / 2) .., columns 28·(q % 2) ...
  const std::size_t first = b.pixels.size();
  b.pixels.resize(first + static_cast<std::size_t>(kVqaGridSide) * kVqaGridSide);
  for (int q = 0; q < 4; ++q) {
    const auto image = set_->image(s.images[static_cast<std::size_t>(q)]);
    for (int y = 0; y < kVqaCellSide; ++y)
      for (int x = 0; x < kVqaCellSide; ++x) {
        const int gy = (q / 2) * kVqaCellSide + y, gx = (q % 2) * kVqaCellSide + x;
        b.pixels[first + static_cast<std::size_t>(gy * kVqaGridSide + gx)] =
            lut_[image[static_cast<std::size_t>(y * kVqaCellSide + x)]];
      }
  }
  // Left padding up to the model's question length: the last token stays last.
  b.ids.insert(b.ids.end(), static_cast<std::size_t>(question_len_ - kVqaQuestionTokens), kVqaPad);
  b.ids.insert(b.ids.end(), s.question.words.begin(), s.question.words.end());
  b.answers.push_back(s.question.answer);
  ++b.rows;
}

Result<VqaBatch> VqaLoader::next(int batch) {
  if (batch < 1) return make_error("the batch size must be positive, got {}", batch);
  MT_TRY(check_vqa_images(*set_));
  VqaBatch b;
  const std::uint64_t first = state_.draws + static_cast<std::uint64_t>(dp_rank_) * batch;
  for (int i = 0; i < batch; ++i) append(b, sample(first + static_cast<std::uint64_t>(i)));
  state_.draws += static_cast<std::uint64_t>(batch) * dp_;
  return b;
}

Status check_vqa_images(const ImageSet& set) {
  if (set.count < 4 || set.pixels.size() != static_cast<std::size_t>(set.count) * set.image_size())
    return make_error("the image set '{}' holds {} images; a grid needs 4", set.images_path, set.count);
  if (set.rows != kVqaCellSide || set.cols != kVqaCellSide || set.channels != 1)
    return make_error("the images in '{}' are {}×{}×{}; VQA grids are made of 28×28×1 Fashion-MNIST images",
                      set.images_path, set.rows, set.cols, set.channels);
  if (set.classes > kVqaGarments)
    return make_error("the images in '{}' carry {} classes; VQA questions name Fashion-MNIST's {} garments",
                      set.labels_path, set.classes, kVqaGarments);
  return ok_status();
}

Result<std::vector<VqaBatch>> vqa_evaluation_batches(const ImageSet& set, const PixelStats& stats, int batch,
                                                     int question_len, std::int64_t max_questions) {
  if (batch < 1) return make_error("the batch size must be positive, got {}", batch);
  if (max_questions < 1) return make_error("evaluation needs at least one question, got {}", max_questions);
  MT_TRY(check_vqa_images(set));
  VqaLoader loader(set, stats, kVqaEvaluationSeed, question_len);
  std::vector<VqaBatch> out;
  const std::int64_t count = std::min(set.count / 4, max_questions);
  for (std::int64_t i = 0; i < count; i += batch) {
    MT_ASSIGN(VqaBatch b, loader.next(static_cast<int>(std::min<std::int64_t>(batch, count - i))));
    out.push_back(std::move(b));
  }
  return out;
}

double majority_answer_accuracy(const std::vector<std::int32_t>& reference, const std::vector<std::int32_t>& answers) {
  std::map<std::int32_t, std::int64_t> counts;
  for (std::int32_t a : reference) ++counts[a];
  if (counts.empty() || answers.empty()) return 0;
  const std::int32_t majority =
      std::max_element(counts.begin(), counts.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  const auto hits = std::count(answers.begin(), answers.end(), majority);
  return static_cast<double>(hits) / static_cast<double>(answers.size());
}

}  // namespace meshtrain
