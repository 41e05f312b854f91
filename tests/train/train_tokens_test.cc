// `meshtrain train --data` on token files end to end: a model whose vocabulary
// is past 256 trains on an llm.c file and a Megatron dataset, resumes bit for
// bit, and is refused ids past its vocabulary.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"
#include "tests/training/token_files.h"

namespace fs = std::filesystem;
using namespace meshtrain::testing;

namespace {

fs::path scratch(const std::string& name) { return meshtrain::testing::scratch_path("tokens-test", name); }

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// A model of vocabulary 512: past bytes, so only token files can feed it.
std::string model512() {
  static const std::string path = [] {
    const fs::path p = scratch("vocab512.json");
    std::ofstream(p) << R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64})";
    return p.string();
  }();
  return path;
}

// Ids a model learns in a few steps: a cycle through 16 ids between 300 and
// 495 (past bytes' 256), each fixing the next, so the loss falls from ln 512
// towards ln 16 and below.
std::vector<std::uint32_t> cycle(std::size_t n, std::size_t first = 0) {
  std::vector<std::uint32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::uint32_t>(300 + (first + i) * 5 % 16 * 13);
  return ids;
}

const std::string kRun = " --seq-len 16 --micro-batch 4 --lr 3e-3 --warmup 2 --quiet";

}  // namespace

TEST_CASE("a vocabulary-512 model trains on an llm.c token file and resumes bit for bit", "[train][tokens]") {
  const fs::path data = scratch("cycle.bin");
  write_llmc(data.string(), cycle(20000));
  const fs::path once = scratch("once.jsonl"), twice = scratch("twice.jsonl"), dir = scratch("ckpt");
  const std::string args = "train --model " + model512() + " --data " + data.string() + kRun + " --steps 12";
  MeshtrainRun r = run_meshtrain(args + " --metrics " + once.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto a = losses(once);
  REQUIRE(a.size() == 12);
  for (double l : a) CHECK(std::isfinite(l));
  // Near uniform over 512 ids at first, then clearly lower.
  CHECK(a.front() == Approx(std::log(512.0)).margin(0.5));
  CHECK((a[9] + a[10] + a[11]) / 3 < a.front() - 1.0);

  REQUIRE(run_meshtrain(args + " --stop-at 5 --checkpoint " + dir.string() + " --metrics " + twice.string()).status == 0);
  MeshtrainRun resumed = run_meshtrain(args + " --checkpoint " + dir.string() + " --resume --metrics " + twice.string());
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
  CHECK(losses(twice) == a);
}

TEST_CASE("a Megatron .bin/.idx dataset trains from its PREFIX for three steps", "[train][tokens]") {
  const fs::path prefix = scratch("megatron_text_document");
  std::vector<std::vector<std::uint32_t>> docs;
  for (std::size_t k = 0; k < 40; ++k) docs.push_back(cycle(250, k * 250));
  write_megatron(prefix.string(), docs);
  const fs::path metrics = scratch("megatron.jsonl");
  MeshtrainRun r = run_meshtrain("train --model " + model512() + " --data " + prefix.string() + kRun +
                                 " --steps 3 --metrics " + metrics.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto l = losses(metrics);
  REQUIRE(l.size() == 3);
  for (double x : l) CHECK(std::isfinite(x));
  CHECK(l.back() < l.front());
}

TEST_CASE("token files whose ids do not fit the model, and bytes for a larger model, are refused", "[train][tokens]") {
  const fs::path data = scratch("gpt2-ids.bin");
  auto ids = cycle(5000);
  ids[4321] = 50000;
  write_llmc(data.string(), ids);
  MeshtrainRun r = run_meshtrain("train --model " + model512() + " --data " + data.string() + kRun + " --steps 3");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("token file '" + data.string() + "' holds token id 50000 (token 4321") &&
                        Catch::Contains("has vocab 512"));
  const fs::path text = scratch("text.txt");
  std::ofstream(text) << std::string(5000, 'a');
  MeshtrainRun bytes = run_meshtrain("train --model " + model512() + " --data " + text.string() + kRun + " --steps 3");
  CHECK(bytes.status != 0);
  CHECK_THAT(bytes.out, Catch::Contains("is read as bytes (vocab 256)"));
}
