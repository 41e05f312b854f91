// An output never destroys an input (engine/cli/path_guard.h): every
// command's path flags go through one check before it runs. Each refusal
// names both flags, and the input is left byte for byte as it was.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/reliability/cli.h"
#include "tests/training/temp_dir.h"

using namespace meshtrain::testing;

namespace {

std::string contents(const fs::path& p) { return read_file(p); }

// Runs `args`, expects the refusal naming both flags, and the input unchanged.
void refused_keeping(const std::string& args, const fs::path& input, const std::string& out_flag,
                     const std::string& in_flag) {
  const std::string before = contents(input);
  expect_refusal(args, out_flag);
  expect_refusal(args, in_flag);
  CHECK(contents(input) == before);
}

}  // namespace

TEST_CASE("an output that is one of the command's inputs is refused, naming both flags", "[reliability][outputs]") {
  // A copy of the training text, so that a failure of the guard cannot spoil other tests' data.
  const fs::path data = write_text("outputs-data.txt", contents(training_text()));
  const std::string train = tiny_train(data.string()) + " --steps 1";
  refused_keeping(train + " --trace " + data.string(), data, "--trace", "--data");
  refused_keeping(train + " --metrics " + data.string(), data, "--metrics", "--data");
  // The same file by another name: "." and "..", a symbolic link, a hard link.
  const fs::path dir = data.parent_path();
  refused_keeping(train + " --trace " + (dir / "." / ".." / dir.filename() / data.filename()).string(), data,
                  "--trace", "--data");
  const fs::path sym = scratch("outputs-symlink.txt"), hard = scratch("outputs-hardlink.txt");
  fs::create_symlink(data, sym);
  fs::create_hard_link(data, hard);
  refused_keeping(train + " --trace " + sym.string(), data, "--trace", "--data");
  refused_keeping(train + " --metrics " + hard.string(), data, "--metrics", "--data");

  // A plan file being trained, and a model file being planned.
  const fs::path plan = write_text("outputs-plan.json", R"({"tp": 1, "pp": 1, "dp": 1})");
  refused_keeping(train + " --plan " + plan.string() + " --trace " + plan.string(), plan, "--trace", "--plan");
  const fs::path model = write_text(
      "outputs-model.json",
      R"({"name": "m", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64})");
  refused_keeping("plan --model " + model.string() + " --gpus 8 --out " + model.string(), model, "--out",
                  "--model");
}

TEST_CASE("two outputs of one command on one file, and an empty output path, are refused", "[reliability][outputs]") {
  const fs::path out = scratch("outputs-both.json");
  expect_refusal(tiny_train() + " --steps 1 --trace " + out.string() + " --metrics " + out.string(), "--metrics");
  expect_refusal(tiny_train() + " --steps 1 --trace " + out.string() + " --metrics " + out.string(), "--trace");
  CHECK_FALSE(fs::exists(out));
  expect_refusal(tiny_train() + " --steps 1 --trace ''", "--trace is empty");
  expect_refusal("simulate --model tiny --gpus 1 --trace ''", "--trace is empty");
}

TEST_CASE("an output inside another run's checkpoint folder is refused, and that checkpoint still resumes",
          "[reliability][outputs]") {
  const fs::path ckpt = scratch("outputs-ckpt");
  const MeshtrainRun first = run_meshtrain(tiny_train() + " --steps 2 --checkpoint " + ckpt.string());
  INFO(first.out);
  REQUIRE(first.status == 0);
  // Another run's metrics, trace, or a simulation's trace, pointed into it.
  const fs::path inside = ckpt / "metrics.jsonl";
  expect_refusal(tiny_train() + " --steps 1 --metrics " + inside.string(), "inside the checkpoint folder");
  expect_refusal("simulate --model tiny --gpus 1 --trace " + (ckpt / "t.json").string(),
                 "inside the checkpoint folder");
  CHECK_FALSE(fs::exists(inside));
  const MeshtrainRun resumed = run_meshtrain(tiny_train() + " --steps 3 --resume --checkpoint " + ckpt.string());
  INFO(resumed.out);
  CHECK(resumed.status == 0);
}

TEST_CASE("positional inputs and a subcommand's flags are guarded too", "[reliability][outputs]") {
  const fs::path metrics = write_text("outputs-metrics.jsonl", "{\"step\": 1, \"loss\": 5.5}\n");
  refused_keeping("plot " + metrics.string() + " --out " + metrics.string(), metrics, "--out", "metrics");
  const fs::path text = write_text("outputs-text.txt", "some text\n");
  refused_keeping("tokenize encode --model " + scratch("outputs-no-model").string() + " --input " + text.string() +
                      " --out " +
                      text.string(),
                  text, "--out", "--input");
}
