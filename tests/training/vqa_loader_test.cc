// The VQA data: the questions' vocabulary and answers, and grids of real
// Fashion-MNIST images: deterministic, split by image, answered correctly,
// split over data-parallel ranks as the other loaders are.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "engine/data/image_dataset.h"
#include "engine/data/vqa_loader.h"
#include "tests/skip.h"

using namespace meshtrain;

namespace {

std::vector<std::string> words_of(const VqaQuestion& q) {
  std::istringstream in(vqa_text(q.words));
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

const std::vector<std::string> kGarments = {"tshirt", "trouser", "pullover", "dress", "coat",
                                            "sandal", "shirt",   "sneaker",  "bag",   "boot"};

// The answer to `q` about a grid of `labels`, worked out from the question's words.
std::string expected_answer(const VqaQuestion& q, const std::array<int, 4>& labels) {
  const std::vector<std::string> w = words_of(q);
  if (w.front() == "what") {
    const int quadrant = (w[4] == "bottom" ? 2 : 0) + (w[5] == "right" ? 1 : 0);
    return kGarments[static_cast<std::size_t>(labels[static_cast<std::size_t>(quadrant)])];
  }
  if (w.front() == "is") {
    const auto g = std::find(kGarments.begin(), kGarments.end(), w[3]) - kGarments.begin();
    return std::find(labels.begin(), labels.end(), g) != labels.end() ? "yes" : "no";
  }
  int shoes = 0;
  for (int l : labels) shoes += l == 5 || l == 7 || l == 9;  // sandal, sneaker, ankle boot
  return std::vector<std::string>{"zero", "one", "two", "three", "four"}[static_cast<std::size_t>(shoes)];
}

std::string word(std::int32_t id) { return vqa_vocabulary()[static_cast<std::size_t>(id)]; }

const ImageDataset* fashion_mnist() {
  static const std::optional<ImageDataset> data = []() -> std::optional<ImageDataset> {
    if (!std::filesystem::is_directory(kFashionMnistDir)) return std::nullopt;
    auto d = load_image_dataset("fashion-mnist");
    INFO((d.ok() ? std::string() : d.error().message()));
    REQUIRE(d.ok());  // installed but unreadable: a failure, not a skip
    return std::move(d).value();
  }();
  return data ? &*data : nullptr;
}

#define REQUIRE_FASHION_MNIST()                                                                             \
  const ImageDataset* data = fashion_mnist();                                                               \
  if (data == nullptr) {                                                                                    \
    MT_SKIP_MISSING(kFashionMnistDir, "dataset-fashion-mnist");                                             \
  }

}  // namespace

TEST_CASE("VQA questions: a small vocabulary, left-padded questions, answers worked out from the grid", "[vqa-data]") {
  const auto& vocab = vqa_vocabulary();
  CHECK(vocab.size() == 32);
  CHECK(std::set<std::string>(vocab.begin(), vocab.end()).size() == vocab.size());
  CHECK(vocab[kVqaPad] == "<pad>");
  const std::array<int, 4> labels = {8, 5, 0, 9};  // bag, sandal / tshirt, ankle boot
  std::map<VqaQuestionKind, int> kinds;
  for (std::uint64_t draw = 0; draw < 600; ++draw) {
    const VqaQuestion q = make_vqa_question(labels, draw * 7919);
    INFO(vqa_text(q.words) << " -> " << word(q.answer));
    REQUIRE(q.words.size() == kVqaQuestionTokens);
    CHECK(q.words.back() == vqa_word("?"));  // the last row is always the question's last word
    CHECK(word(q.answer) == expected_answer(q, labels));
    ++kinds[q.kind];
  }
  CHECK(kinds.size() == 3);
  CHECK(vqa_text(make_vqa_question(labels, 0).words) == "what is at the top left ?");
  CHECK(word(make_vqa_question(labels, 0).answer) == "bag");
  CHECK(word(make_vqa_question(labels, 2).answer) == "two");  // the sandal and the boot
}

TEST_CASE("VQA grids of Fashion-MNIST are deterministic, answered correctly and split by image", "[vqa-data]") {
  REQUIRE_FASHION_MNIST();
  const int Q = 8;  // one more than the longest question: one pad in front of every question
  VqaLoader a(data->train, data->stats, 42, Q), b(data->train, data->stats, 42, Q), c(data->train, data->stats, 43, Q);
  auto x = a.next(16), y = b.next(16), z = c.next(16);
  REQUIRE((x.ok() && y.ok() && z.ok()));
  CHECK(x->pixels == y->pixels);
  CHECK(x->ids == y->ids);
  CHECK(x->answers == y->answers);
  CHECK(x->pixels != z->pixels);
  REQUIRE(x->pixels.size() == 16u * 56 * 56);
  REQUIRE(x->ids.size() == 16u * Q);

  const std::vector<float> lut = normalise_table(data->stats);
  for (std::uint64_t i = 0; i < 16; ++i) {
    const VqaSample s = a.sample(i);
    INFO("sample " << i << ": " << vqa_text(s.question.words) << " -> " << word(s.question.answer));
    CHECK(x->answers[i] == s.question.answer);
    CHECK(x->ids[i * Q] == kVqaPad);
    CHECK(std::vector<std::int32_t>(x->ids.begin() + static_cast<std::ptrdiff_t>(i * Q + 1),
                                    x->ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * Q)) == s.question.words);
    CHECK(word(s.question.answer) == expected_answer(s.question, s.labels));
    // Quadrant q of the grid is training image s.images[q], normalised.
    for (std::size_t q = 0; q < 4; ++q) {
      const auto image = data->train.image(s.images[q]);
      CHECK(s.labels[q] == data->train.labels[static_cast<std::size_t>(s.images[q])]);
      for (std::size_t p : {0, 29, 407, 783}) {
        const std::size_t gy = (q / 2) * 28 + p / 28, gx = (q % 2) * 28 + p % 28;
        CHECK(x->pixels[i * 56 * 56 + gy * 56 + gx] == lut[image[p]]);
      }
    }
  }
  // One epoch of training grids shows every training image once.
  std::set<std::int64_t> seen;
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(data->train.count / 4); ++i)
    for (std::int64_t image : a.sample(i).images) seen.insert(image);
  CHECK(static_cast<std::int64_t>(seen.size()) == data->train.count);

  // The evaluation questions: test images only, each of them once.
  auto eval = vqa_evaluation_batches(data->test, data->stats, 100, Q);
  REQUIRE(eval.ok());
  std::size_t questions = 0;
  for (const VqaBatch& batch : *eval) questions += batch.answers.size();
  CHECK(questions == static_cast<std::size_t>(data->test.count / 4));
  VqaLoader test_order(data->test, data->stats, kVqaEvaluationSeed, Q);
  std::set<std::int64_t> tested;
  for (std::size_t i = 0; i < questions; ++i)
    for (std::int64_t image : test_order.sample(i).images) tested.insert(image);
  CHECK(static_cast<std::int64_t>(tested.size()) == data->test.count);
  CHECK(eval->front().pixels == test_order.next(100)->pixels);  // the test set's images, not the training set's
}

TEST_CASE("VQA data splits over data-parallel ranks as the other loaders and resumes from its state", "[vqa-data]") {
  REQUIRE_FASHION_MNIST();
  VqaLoader one(data->train, data->stats, 7, kVqaQuestionTokens);
  VqaLoader r0(data->train, data->stats, 7, kVqaQuestionTokens, 0, 2), r1(data->train, data->stats, 7,
                                                                          kVqaQuestionTokens, 1, 2);
  for (int step = 0; step < 3; ++step) {
    auto whole = one.next(8), a = r0.next(4), b = r1.next(4);
    REQUIRE((whole.ok() && a.ok() && b.ok()));
    std::vector<std::int32_t> answers = a->answers, ids = a->ids;
    answers.insert(answers.end(), b->answers.begin(), b->answers.end());
    ids.insert(ids.end(), b->ids.begin(), b->ids.end());
    CHECK(answers == whole->answers);
    CHECK(ids == whole->ids);
    CHECK(r0.state() == one.state());
    CHECK(r1.state() == one.state());
  }
  VqaLoader resumed(data->train, data->stats, 1, kVqaQuestionTokens);
  resumed.restore(one.state());
  CHECK(resumed.next(8)->answers == one.next(8)->answers);
}

TEST_CASE("VQA answers: yes and no balance, the majority answer is a weak baseline", "[vqa-data]") {
  REQUIRE_FASHION_MNIST();
  VqaLoader train(data->train, data->stats, 1, kVqaQuestionTokens);
  auto batch = train.next(6000);
  auto eval = vqa_evaluation_batches(data->test, data->stats, 2500, kVqaQuestionTokens);
  REQUIRE((batch.ok() && eval.ok()));
  std::map<std::string, int> counts;
  for (std::int32_t a : batch->answers) ++counts[word(a)];
  CHECK(counts["yes"] == Approx(counts["no"]).epsilon(0.1));
  const double majority = majority_answer_accuracy(batch->answers, eval->front().answers);
  // A stronger blind baseline: the most frequent answer of each question's words, without the image.
  const auto& q = kVqaQuestionTokens;
  std::map<std::vector<std::int32_t>, std::map<std::int32_t, int>> by_question;
  for (std::size_t i = 0; i < batch->answers.size(); ++i)
    ++by_question[{batch->ids.begin() + static_cast<std::ptrdiff_t>(i * q),
                   batch->ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * q)}][batch->answers[i]];
  int blind_hits = 0;
  const VqaBatch& test = eval->front();
  for (std::size_t i = 0; i < test.answers.size(); ++i) {
    const auto& answers = by_question[{test.ids.begin() + static_cast<std::ptrdiff_t>(i * q),
                                       test.ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * q)}];
    const auto best = std::max_element(answers.begin(), answers.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; });
    blind_hits += best != answers.end() && best->first == test.answers[i];
  }
  const double blind = static_cast<double>(blind_hits) / static_cast<double>(test.answers.size());
  WARN("on the " << test.answers.size() << " test questions: majority-answer baseline " << majority
                 << ", the best answer of each question without the image " << blind);
  CHECK(majority > 0.1);
  CHECK(majority < 0.25);
  CHECK(blind < 0.45);  // the image is needed
}
