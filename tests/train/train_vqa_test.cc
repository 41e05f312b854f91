// `meshtrain train` on visual questions end to end: the tiny VQA model
// learns Fashion-MNIST grids well above the majority-answer baseline,
// training resumes bit for bit under data parallelism, and image sets that
// cannot make grids are refused.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/data/image_dataset.h"
#include "engine/data/vqa_loader.h"
#include "tests/run_meshtrain.h"
#include "tests/skip.h"
#include "tests/train/train_files.h"
#include "tests/training/idx_files.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return meshtrain::testing::train_scratch("vqa-test", name); }
using meshtrain::testing::read_metrics;

#define REQUIRE_FASHION_MNIST() \
  if (!fs::exists(meshtrain::kFashionMnistDir)) MT_SKIP_MISSING(meshtrain::kFashionMnistDir, "dataset-fashion-mnist")

constexpr int kEvalQuestions = 1000;

// The majority answer of as many training questions as the run draws,
// scored on the run's evaluation questions.
double majority_baseline(int train_questions) {
  auto data = meshtrain::load_image_dataset("fashion-mnist");
  REQUIRE(data.ok());
  meshtrain::VqaLoader train(data->train, data->stats, 1234, meshtrain::kVqaQuestionTokens);  // the CLI's seed
  auto seen = train.next(train_questions);
  auto eval = meshtrain::vqa_evaluation_batches(data->test, data->stats, kEvalQuestions,
                                                meshtrain::kVqaQuestionTokens, kEvalQuestions);
  REQUIRE((seen.ok() && eval.ok()));
  return meshtrain::majority_answer_accuracy(seen->answers, eval->front().answers);
}

}  // namespace

TEST_CASE("the tiny VQA model answers Fashion-MNIST questions well above the majority answer", "[train][vqa]") {
  REQUIRE_FASHION_MNIST();
  const int steps = 300, batch = 32;
  const fs::path m = scratch("learn") / "m.jsonl";
  MeshtrainRun r = run_meshtrain("train --data fashion-mnist --model vqa-tiny --micro-batch " + std::to_string(batch) +
                                 " --steps " + std::to_string(steps) + " --lr 3e-3 --warmup 30 --eval-every " +
                                 std::to_string(steps) + " --eval-images " + std::to_string(kEvalQuestions) +
                                 " --quiet --metrics " + m.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto lines = read_metrics(m);
  REQUIRE(lines.size() == static_cast<std::size_t>(steps));
  REQUIRE(lines.back().contains("val_accuracy"));
  const double accuracy = lines.back()["val_accuracy"].get<double>(), baseline = majority_baseline(steps * batch);
  WARN("vqa-tiny after " << steps << " steps: test accuracy " << accuracy << ", majority-answer baseline " << baseline);
  CHECK(baseline < 0.2);
  CHECK(accuracy > baseline + 0.2);
}

TEST_CASE("VQA training resumes bit for bit under data parallelism", "[train][vqa]") {
  REQUIRE_FASHION_MNIST();
  const fs::path dir = scratch("resume"), once = dir / "once.jsonl", twice = dir / "twice.jsonl", ckpt = dir / "ckpt";
  const std::string base = "train --data fashion-mnist --model vqa-tiny --dp 2 --zero 1 --micro-batch 4 --lr 1e-3 "
                           "--warmup 2 --quiet --steps 8 --dropout 0.1";
  REQUIRE(run_meshtrain(base + " --metrics " + once.string()).status == 0);
  meshtrain::testing::run_stopped_at(base, 4, ckpt, twice);
  meshtrain::testing::run_resumed(base, ckpt, twice);
  meshtrain::testing::check_same_losses(once, twice);
}

TEST_CASE("images that cannot make VQA grids, or a model that cannot read them, are refused", "[train][vqa]") {
  // 8×8 images: a grid needs Fashion-MNIST's 28×28.
  const fs::path dir = scratch("small");
  auto write = [&](const std::string& name, std::uint32_t magic, std::vector<std::uint32_t> dims, std::size_t bytes) {
    std::ofstream(dir / name, std::ios::binary) << meshtrain::testing::idx_bytes(magic, dims, std::string(bytes, 1));
  };
  for (const std::string prefix : {"train", "t10k"}) {
    write(prefix + "-images-idx3-ubyte", meshtrain::kIdxImagesMagic, {8, 8, 8}, 8 * 64);
    write(prefix + "-labels-idx1-ubyte", meshtrain::kIdxLabelsMagic, {8}, 8);
  }
  MeshtrainRun small = run_meshtrain("train --data " + dir.string() + " --model vqa-tiny --steps 1 --warmup 0 --quiet");
  CHECK(small.status != 0);
  CHECK_THAT(small.out, Catch::Contains("8×8×1") && Catch::Contains("28×28×1"));
  REQUIRE_FASHION_MNIST();
  // A VQA model whose images are not the 56×56 grids.
  const fs::path model = dir / "vqa28.json";
  std::ofstream(model) << R"({"family": "vqa", "image_size": 28, "patch": 7, "channels": 1,
    "vision": {"layers": 1, "hidden": 16, "heads": 2}, "decoder_layers": 1, "hidden": 16, "heads": 2,
    "vocab": 48, "question_len": 7})";
  MeshtrainRun wrong =
      run_meshtrain("train --data fashion-mnist --model " + model.string() + " --steps 1 --warmup 0 --quiet");
  CHECK(wrong.status != 0);
  CHECK_THAT(wrong.out, Catch::Contains("56×56×1"));
}
