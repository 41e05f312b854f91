// `meshtrain train` end to end: loss falls, resume is bit-exact, bad input
// gets a clear error and loses nothing already saved.
#include <catch2/catch.hpp>

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/train/train_files.h"
#include "tests/training/temp_dir.h"

namespace fs = std::filesystem;

using meshtrain::testing::run_resumed;
using meshtrain::testing::run_stopped_at;

namespace {


fs::path scratch(const std::string& name) { return meshtrain::testing::scratch_path("train-test", name); }

// Text every checkout has: the project's own sources and docs.
std::string corpus() {
  static const fs::path path = [] {
    fs::path p = scratch("corpus.txt");
    std::ofstream out(p, std::ios::binary);
    // Sorted: the directory iterator's order depends on the file system.
    std::vector<fs::path> files;
    for (const char* dir : {"engine", "models", "backends/cpu", "simulator"})
      for (const auto& e : fs::recursive_directory_iterator(fs::path(MESHTRAIN_SOURCE_DIR) / dir))
        if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) out << std::ifstream(f, std::ios::binary).rdbuf();
    return p;
  }();
  return path.string();
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// The checkpoint in dir holds tensors of each of these names.
void check_checkpoint_holds(const fs::path& dir, std::initializer_list<const char*> wanted) {
  std::ifstream manifest(dir / "manifest.json");
  const auto m = nlohmann::json::parse(manifest);
  std::vector<std::string> names;
  for (const auto& t : m["tensors"]) names.push_back(t["name"]);
  for (const char* name : wanted) CHECK(std::find(names.begin(), names.end(), name) != names.end());
}

// The run of `once` and the stopped and resumed one of `twice` wrote the same
// `steps` losses, bit for bit; returns them.
std::vector<double> check_same_step_losses(const fs::path& once, const fs::path& twice, std::size_t steps) {
  const auto a = losses(once), b = losses(twice);
  REQUIRE(a.size() == steps);
  CHECK(a == b);
  return a;
}

const std::string kBase = " --model tiny --seq-len 32 --micro-batch 4 --quiet";
const std::string kLr = " --lr 3e-3 --warmup 5";

}  // namespace

TEST_CASE("training the tiny model makes the loss fall clearly", "[train]") {
  fs::path metrics = scratch("fall.jsonl");
  MeshtrainRun r = run_meshtrain("train --data " + corpus() + kBase + kLr + " --steps 60 --metrics " + metrics.string());
  REQUIRE(r.status == 0);
  auto l = losses(metrics);
  REQUIRE(l.size() == 60);
  // Near uniform at initialisation; a little below ln 256 by how many repeated
  // bytes (indentation) the first batch draws from the corpus, which is the
  // tree's own sources: tied embeddings already favour repeating a byte.
  CHECK(l.front() == Approx(std::log(256.0)).margin(0.3));
  // The corpus's content moves with every change: ask for a clear fall
  // (1.5 nats below uniform) of the last ten steps' mean, not of one
  // 128-token batch's loss (which swings by ±0.5 from batch to batch).
  double tail = 0;
  for (std::size_t i = l.size() - 10; i < l.size(); ++i) tail += l[i] / 10;
  CHECK(tail < std::log(256.0) - 1.5);
  std::ifstream in(metrics);
  std::string first;
  std::getline(in, first);
  auto j = nlohmann::json::parse(first);
  for (const char* key : {"step", "loss", "lr", "step_time_s", "tokens_per_s"}) CHECK(j.contains(key));
}

TEST_CASE("stop and resume give the losses of one uninterrupted run, bit for bit", "[train]") {
  fs::path once = scratch("once.jsonl"), twice = scratch("twice.jsonl"), dir = scratch("ckpt");
  const std::string args = "train --data " + corpus() + kBase + kLr + " --steps 12 --dropout 0.1";
  REQUIRE(run_meshtrain(args + " --metrics " + once.string()).status == 0);
  run_stopped_at(args, 6, dir, twice);
  run_resumed(args, dir, twice);
  check_same_step_losses(once, twice, 12);
}

TEST_CASE("a 1bit-compressed run resumes bit for bit: every rank's error feedback is in the checkpoint",
          "[train][compression]") {
  // Compressed from step 3; stopped at 5, when the error feedback is two steps old.
  for (const std::string plan : {" --dp 2", " --dp 2 --zero 1"}) {
    INFO("plan:" << plan);
    fs::path once = scratch("1bit-once.jsonl"), twice = scratch("1bit-twice.jsonl"), dir = scratch("1bit-ckpt");
    const std::string args = "train --data " + corpus() + kBase + kLr + plan +
                             " --steps 9 --grad-compression 1bit --grad-compression-warmup 2";
    REQUIRE(run_meshtrain(args + " --metrics " + once.string()).status == 0);
    run_stopped_at(args, 5, dir, twice);
    check_checkpoint_holds(dir, {"grad_error/rank0", "grad_error/rank1"});
    run_resumed(args, dir, twice);
    check_same_step_losses(once, twice, 9);
  }
}

TEST_CASE("fp8 on the cpu backend: emulated, checkpointed with its scaling state, resumed bit for bit",
          "[train][fp8]") {
  fs::path fp32 = scratch("fp8-fp32.jsonl"), once = scratch("fp8-once.jsonl"), twice = scratch("fp8-twice.jsonl"),
           dir = scratch("fp8-ckpt");
  const std::string args = "train --data " + corpus() + kBase + kLr + " --tp 2 --steps 6";
  REQUIRE(run_meshtrain(args + " --metrics " + fp32.string()).status == 0);
  REQUIRE(run_meshtrain(args + " --precision fp8 --metrics " + once.string()).status == 0);
  run_stopped_at(args + " --precision fp8", 3, dir, twice);
  check_checkpoint_holds(dir, {"fp8/layers.0.attn.qkv", "fp8/layers.1.mlp.down"});
  run_resumed(args + " --precision fp8", dir, twice);
  const auto a = check_same_step_losses(once, twice, 6), c = losses(fp32);
  CHECK(a.front() != c.front());  // the FP8 casts change the first step's logits already
  CHECK(a.front() == Approx(c.front()).epsilon(1e-2));
}

TEST_CASE("fp8 current scaling on the cpu backend: trains, resumes bit for bit with no scaling state, refuses what "
          "it cannot emulate",
          "[train][fp8]") {
  fs::path delayed = scratch("fp8cs-delayed.jsonl"), once = scratch("fp8cs-once.jsonl"),
           twice = scratch("fp8cs-twice.jsonl"), dir = scratch("fp8cs-ckpt");
  const std::string args = "train --data " + corpus() + kBase + kLr + " --tp 2 --steps 6 --precision fp8";
  REQUIRE(run_meshtrain(args + " --metrics " + delayed.string()).status == 0);
  const std::string current = args + " --fp8-recipe current";
  REQUIRE(run_meshtrain(current + " --metrics " + once.string()).status == 0);
  run_stopped_at(current, 3, dir, twice);
  run_resumed(current, dir, twice);
  const auto a = check_same_step_losses(once, twice, 6), d = losses(delayed);
  CHECK(a.front() != d.front());  // step 1 already casts with the tensors' own scales, not 1
  CHECK(a.front() == Approx(d.front()).epsilon(1e-2));

  const MeshtrainRun no_fp8 = run_meshtrain("train --data " + corpus() + kBase + " --steps 1 --fp8-recipe current");
  CHECK(no_fp8.status != 0);
  CHECK_THAT(no_fp8.out, Catch::Contains("fp8_recipe (--fp8-recipe) current scales FP8 tensors, but the plan's "
                                         "precision is fp32: add --precision fp8"));
  const MeshtrainRun unknown = run_meshtrain("train --data " + corpus() + kBase + " --steps 1 --precision fp8 "
                                             "--fp8-recipe tensorwise");
  CHECK(unknown.status != 0);
  CHECK_THAT(unknown.out, Catch::Contains("tensorwise") && Catch::Contains("delayed") && Catch::Contains("current"));
  const MeshtrainRun experts = run_meshtrain("train --data " + corpus() + " --model tiny-moe --seq-len 32 --micro-batch 2 "
                                             "--steps 1 --dp 2 --ep 2 --precision fp8 --fp8-recipe current");
  CHECK(experts.status != 0);
  CHECK_THAT(experts.out, Catch::Contains("fp8_recipe current with ep 2 (etp 1) over tp 1 and cp 1"));
}

TEST_CASE("fp8 on the cuda backend is refused naming the missing FP8 GEMMs", "[train][fp8]") {
  MeshtrainRun r = run_meshtrain("train --data " + corpus() + kBase + " --steps 1 --backend cuda --precision fp8");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("the cuda backend does not train: it has no FP8 GEMMs"));
  CHECK_THAT(r.out, Catch::Contains("--backend cpu"));
}

TEST_CASE("losses, parameters and AdamW state are the same bits on 1, 2 and 3 threads per rank (--threads)",
          "[train][threads]") {
  // Wide enough that every GEMM is cut into tiles (512 x 768 x 256 and up) and
  // AdamW, the gradient norm and the initialisation run over many chunks.
  const fs::path model = scratch("wide.json");
  std::ofstream(model) << R"({"name": "wide-1", "layers": 1, "hidden": 256, "heads": 4, "vocab": 256, "seq_len": 64})";
  auto run = [&](const std::string& plan, int threads) {
    const std::string name = "threads-" + std::to_string(threads) + (plan.empty() ? "" : "-tp2");
    const fs::path dir = scratch(name), metrics = scratch(name + ".jsonl");
    MeshtrainRun r = run_meshtrain("train --data " + corpus() + " --model " + model.string() + plan +
                                   " --seq-len 64 --micro-batch 8 --steps 3 --quiet --threads " + std::to_string(threads) +
                                   " --checkpoint " + dir.string() + " --metrics " + metrics.string());
    INFO(r.out);
    REQUIRE(r.status == 0);
    std::string payload;  // the checkpoint's tensors: parameters, AdamW moments
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".bin") payload += (std::ostringstream() << std::ifstream(e.path(), std::ios::binary).rdbuf()).str();
    REQUIRE(!payload.empty());
    return std::make_pair(losses(metrics), payload);
  };
  for (const std::string plan : {"", " --tp 2"}) {
    INFO("plan:" << plan);
    const auto one = run(plan, 1);
    REQUIRE(one.first.size() == 3);
    for (int threads : {2, 3}) {
      INFO(threads << " threads per rank");
      const auto more = run(plan, threads);
      CHECK(more.first == one.first);
      CHECK(more.second == one.second);
    }
  }
}

TEST_CASE("bad training input gets a clear error", "[train]") {
  fs::path empty = scratch("empty.txt"), tiny = scratch("short.txt");
  std::ofstream(empty).close();
  std::ofstream(tiny) << "only a few bytes";
  MeshtrainRun missing = run_meshtrain("train --data /nonexistent/data.txt" + kBase);
  CHECK(missing.status != 0);
  CHECK_THAT(missing.out, Catch::Contains("/nonexistent/data.txt"));
  MeshtrainRun e = run_meshtrain("train --data " + empty.string() + kBase);
  CHECK(e.status != 0);
  CHECK_THAT(e.out, Catch::Contains("empty"));
  MeshtrainRun s = run_meshtrain("train --data " + tiny.string() + kBase);
  CHECK(s.status != 0);
  CHECK_THAT(s.out, Catch::Contains("--seq-len 32"));
  MeshtrainRun unwritable = run_meshtrain("train --data " + corpus() + kBase + " --checkpoint " + tiny.string() + "/ckpt");
  CHECK(unwritable.status != 0);
  CHECK_THAT(unwritable.out, Catch::Contains(tiny.string()));
  MeshtrainRun big_model = run_meshtrain("train --data " + corpus() + " --model gpt2-124m --steps 1");
  CHECK(big_model.status != 0);
  CHECK_THAT(big_model.out, Catch::Contains("vocab 50257"));
}

TEST_CASE("a NaN loss stops the run and keeps the last good checkpoint", "[train]") {
  fs::path dir = scratch("nan-ckpt");
  MeshtrainRun r = run_meshtrain("train --data " + corpus() + kBase + " --steps 20 --lr 1e30 --warmup 0 --grad-clip 0 --checkpoint " +
              dir.string() + " --checkpoint-every 1");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("stopping before the update"));
  auto manifest = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  const auto step = manifest["step"].get<int>();
  CHECK(step >= 1);
  CHECK_THAT(r.out, Catch::Contains("step " + std::to_string(step + 1) + ": the loss is"));
}

TEST_CASE("a corrupted or foreign checkpoint is refused", "[train]") {
  fs::path dir = scratch("refuse-ckpt");
  const std::string args = "train --data " + corpus() + kBase + " --warmup 2 --checkpoint " + dir.string();
  MeshtrainRun first = run_meshtrain(args + " --steps 4");
  INFO(first.out);
  REQUIRE(first.status == 0);

  fs::path model = scratch("other-model.json");
  std::ofstream(model) << R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64})";
  MeshtrainRun foreign = run_meshtrain("train --data " + corpus() + " --model " + model.string() +
                    " --seq-len 32 --micro-batch 4 --warmup 2 --steps 8 --quiet --resume --checkpoint " + dir.string());
  CHECK(foreign.status != 0);
  CHECK_THAT(foreign.out, Catch::Contains("layers"));

  fs::path payload;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") payload = e.path();
  REQUIRE(!payload.empty());
  {
    std::fstream f(payload, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  MeshtrainRun corrupt = run_meshtrain(args + " --steps 8 --resume");
  CHECK(corrupt.status != 0);
  CHECK_THAT(corrupt.out, Catch::Contains(payload.filename().string()));
}
