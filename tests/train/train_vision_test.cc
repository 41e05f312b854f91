// `meshtrain train` on images end to end: a vision model learns, resume is
// bit-exact, a data set that does not fit the model is refused by name, and
// the small Swin learns Fashion-MNIST.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/data/image_dataset.h"
#include "tests/run_meshtrain.h"
#include "tests/skip.h"
#include "tests/train/train_files.h"
#include "tests/training/idx_files.h"

namespace fs = std::filesystem;
using meshtrain::testing::idx_bytes;

namespace {

fs::path scratch(const std::string& name) { return meshtrain::testing::train_scratch("vision-test", name); }

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// An MNIST-layout set of side × side images over noise, whose label says
// which pixels are bright: those whose flat index is the label modulo 10.
fs::path bands(const std::string& name, int side, int train, int test) {
  const fs::path dir = scratch(name);
  auto set = [&](const std::string& prefix, int n, std::uint32_t seed) {
    std::string pixels, labels;
    std::uint32_t x = seed;
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>((i * 7 + seed) % 10);
      labels.push_back(static_cast<char>(label));
      for (int p = 0; p < side * side; ++p) {
        x = x * 1664525u + 1013904223u;
        pixels.push_back(static_cast<char>((x >> 26) + (p % 10 == label ? 160 : 40)));
      }
    }
    write(dir / (prefix + "-images-idx3-ubyte"),
          idx_bytes(meshtrain::kIdxImagesMagic, {std::uint32_t(n), std::uint32_t(side), std::uint32_t(side)}, pixels));
    write(dir / (prefix + "-labels-idx1-ubyte"), idx_bytes(meshtrain::kIdxLabelsMagic, {std::uint32_t(n)}, labels));
  };
  set("train", train, 1);
  set("t10k", test, 2);
  return dir;
}

std::vector<nlohmann::json> metrics(const fs::path& path) { return meshtrain::testing::read_metrics(path); }

const std::string kVit = " --model vit-tiny --micro-batch 8 --lr 3e-3 --warmup 5 --quiet";

}  // namespace

TEST_CASE("a ViT learns images and reports its test accuracy", "[train][vision]") {
  const fs::path data = bands("learn", 8, 512, 200), m = scratch("learn-metrics") / "m.jsonl";
  MeshtrainRun r = run_meshtrain("train --data " + data.string() + kVit + " --steps 200 --eval-every 100 --metrics " +
                                 m.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto lines = metrics(m);
  REQUIRE(lines.size() == 200);
  CHECK(lines.front()["loss"].get<double>() == Approx(std::log(10.0)).margin(0.3));
  REQUIRE(lines.back().contains("val_accuracy"));
  CHECK(lines.back()["val_accuracy"].get<double>() > 0.8);  // chance is 0.1
  CHECK(lines.back()["val_loss"].get<double>() < 1.0);
}

TEST_CASE("image training resumes bit for bit, under data parallelism too", "[train][vision]") {
  const fs::path data = bands("resume", 12, 256, 40);
  for (const std::string plan : {"--model vit-tiny", "--model swin-micro --dp 2 --zero 1"}) {
    INFO(plan);
    const fs::path dir = scratch("resume-run"), once = dir / "once.jsonl", twice = dir / "twice.jsonl";
    const fs::path ckpt = dir / "ckpt";
    const std::string base = "train --data " + data.string() + " " + plan + " --micro-batch 4 --lr 1e-3 --warmup 2 " +
                             "--quiet --steps 10 --dropout 0.1";
    // vit-tiny reads 8×8 images: refused (below); 12×12 images suit swin-micro only.
    if (plan.find("vit") != std::string::npos) {
      MeshtrainRun r = run_meshtrain(base + " --metrics " + once.string());
      CHECK(r.status != 0);
      CHECK_THAT(r.out, Catch::Contains("12×12×1") && Catch::Contains("8×8×1"));
      continue;
    }
    REQUIRE(run_meshtrain(base + " --metrics " + once.string()).status == 0);
    meshtrain::testing::run_stopped_at(base, 4, ckpt, twice);
    meshtrain::testing::run_resumed(base, ckpt, twice);
    meshtrain::testing::check_same_losses(once, twice);
  }
}

TEST_CASE("image data that does not fit the model is refused naming the file and the fix", "[train][vision]") {
  const fs::path data = bands("bad", 8, 16, 4);
  // A text model on an image set reads the directory as a file.
  MeshtrainRun text = run_meshtrain("train --data " + data.string() + " --model tiny --steps 1 --quiet");
  CHECK(text.status != 0);
  CHECK_THAT(text.out, Catch::Contains("is an image dataset, but model 'tiny' is a language model"));
  // A truncated image file.
  std::ofstream(data / "t10k-images-idx3-ubyte", std::ios::binary | std::ios::app).write("xx", 2);
  MeshtrainRun bad = run_meshtrain("train --data " + data.string() + kVit + " --steps 6");
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("t10k-images-idx3-ubyte"));
  MeshtrainRun missing = run_meshtrain("train --data " + (data / "nowhere").string() + kVit + " --steps 6");
  CHECK(missing.status != 0);
  CHECK_THAT(missing.out, Catch::Contains("nowhere"));
}

TEST_CASE("the small Swin learns Fashion-MNIST well above chance in a few hundred steps", "[train][vision][fmnist]") {
  if (!fs::exists(meshtrain::kFashionMnistDir)) {
    MT_SKIP_MISSING(meshtrain::kFashionMnistDir, "dataset-fashion-mnist");
  }
  const fs::path m = scratch("fmnist") / "m.jsonl";
  MeshtrainRun r = run_meshtrain(
      "train --data fashion-mnist --model swin-fmnist --dp 2 --micro-batch 16 --steps 300 --lr 2e-3 --warmup 30 "
      "--eval-every 300 --eval-images 2000 --quiet --metrics " + m.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto lines = metrics(m);
  REQUIRE(lines.size() == 300);
  // 9,600 training images; chance is 10%, the majority class 10%.
  CHECK(lines.back()["val_accuracy"].get<double>() >= 0.70);
}

TEST_CASE("image data for a language model and a token file for an image model are refused as the mismatch",
          "[train][vision]") {
  // By name: nothing is read (the check runs whether or not Fashion-MNIST is installed).
  MeshtrainRun named = run_meshtrain("train --model tiny --data fashion-mnist --steps 1 --quiet");
  INFO(named.out);
  CHECK(named.status != 0);
  CHECK_THAT(named.out, Catch::Contains("'fashion-mnist' is an image dataset, but model 'tiny' is a language model"));
  // The presets that take its 28×28 grey images, classifiers and VQA; not vit-tiny (8×8).
  for (const char* model : {"'swin-fmnist'", "'vit-fmnist'", "'vqa-fmnist'"}) CHECK_THAT(named.out, Catch::Contains(model));
  CHECK_THAT(named.out, !Catch::Contains("'vit-tiny'"));
  // The reverse: a file of bytes for a vision model.
  const fs::path file = scratch("tokens") / "text.txt";
  write(file, std::string(4096, 'a'));
  for (const char* model : {"vit-fmnist", "vqa-tiny"}) {
    MeshtrainRun tokens =
        run_meshtrain(std::string("train --model ") + model + " --data " + file.string() + " --steps 1 --quiet");
    INFO(tokens.out);
    CHECK(tokens.status != 0);
    CHECK_THAT(tokens.out, Catch::Contains(std::string("model '") + model + "' is a vision model and trains on images"));
    CHECK_THAT(tokens.out, Catch::Contains("a language model such as 'tiny'"));
  }
}
