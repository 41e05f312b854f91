// A mixture-of-experts model file of the kind that existed before experts
// ran (only `experts` and `top_k`) trains on text, alone and under expert
// parallelism, with the aux loss and load figures in --metrics, resumes bit
// for bit, and simulates; MoE plans that do not fit are refused by number.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "meshtrain_train_moe_test";
  fs::create_directories(dir);
  fs::remove_all(dir / name);
  return dir / name;
}

// Text every checkout has: the model code.
std::string corpus() {
  static const fs::path path = [] {
    fs::path p = scratch("corpus.txt");
    std::ofstream out(p, std::ios::binary);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fs::path(MESHTRAIN_SOURCE_DIR) / "models"))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) out << std::ifstream(f, std::ios::binary).rdbuf();
    return p;
  }();
  return path.string();
}

std::string model_file() {
  static const fs::path path = [] {
    fs::path p = scratch("moe-model.json");
    std::ofstream(p) << R"({"name": "file-moe", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256,
                           "seq_len": 64, "experts": 4, "top_k": 2})";
    return p;
  }();
  return path.string();
}

std::vector<nlohmann::json> lines(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

const std::string kArgs = " --seq-len 32 --micro-batch 4 --lr 3e-3 --warmup 2 --quiet";

}  // namespace

TEST_CASE("a model file with experts and top_k trains, alone and with ep 2, reporting aux loss and load",
          "[train][moe]") {
  for (const std::string plan : {"", " --dp 2 --ep 2"}) {
    INFO("plan '" << plan << "'");
    fs::path metrics = scratch("moe-metrics.jsonl");
    MeshtrainRun r = run_meshtrain("train --data " + corpus() + " --model " + model_file() + kArgs + plan +
                                   " --steps 12 --metrics " + metrics.string());
    INFO(r.out);
    REQUIRE(r.status == 0);
    const auto l = lines(metrics);
    REQUIRE(l.size() == 12);
    for (const char* key : {"aux_loss", "z_loss", "moe_balance", "expert_load_max_mean", "dropped_fraction",
                            "tokens_per_expert"})
      CHECK(l.back().contains(key));
    // Two MoE layers of 4 experts; every step routes 4·32 tokens · top 2 per layer (dp 2: twice the batch).
    REQUIRE(l.back()["tokens_per_expert"].size() == 2);
    double routed = 0;
    for (double t : l.back()["tokens_per_expert"][0]) routed += t;
    CHECK(routed == (plan.empty() ? 256 : 512));
    CHECK(l.back()["expert_load_max_mean"].get<double>() >= 1.0);
    CHECK(l.back()["aux_loss"].get<double>() > 0);
    CHECK(l.back()["dropped_fraction"].get<double>() == 0);  // dropless by default
    CHECK(l.back()["loss"].get<double>() < l.front()["loss"].get<double>());
  }
}

TEST_CASE("an MoE run stopped and resumed under ep 2 and ZeRO 1 gives the same losses", "[train][moe]") {
  fs::path once = scratch("moe-once.jsonl"), twice = scratch("moe-twice.jsonl"), dir = scratch("moe-ckpt");
  const std::string args =
      "train --data " + corpus() + " --model " + model_file() + kArgs + " --dp 2 --ep 2 --zero 1 --steps 8";
  REQUIRE(run_meshtrain(args + " --metrics " + once.string()).status == 0);
  REQUIRE(run_meshtrain(args + " --stop-at 4 --checkpoint " + dir.string() + " --metrics " + twice.string()).status == 0);
  REQUIRE(run_meshtrain(args + " --resume --checkpoint " + dir.string() + " --metrics " + twice.string()).status == 0);
  const auto a = lines(once), b = lines(twice);
  REQUIRE(a.size() == 8);
  REQUIRE(b.size() == 8);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]["loss"] == b[i]["loss"]);
    CHECK(a[i]["aux_loss"] == b[i]["aux_loss"]);
  }
}

TEST_CASE("the same model file simulates, and MoE plans that do not fit are refused by number", "[train][moe]") {
  MeshtrainRun sim = run_meshtrain("simulate --model " + model_file() +
                                   " --cluster dgx-a100 --gpus 8 --ep 4 --global-batch 16 --json");
  INFO(sim.out);
  REQUIRE(sim.status == 0);
  auto j = nlohmann::json::parse(sim.out);
  CHECK(j["moe"]["all_to_all_s"].get<double>() > 0);
  CHECK(j["moe"]["tokens_per_expert"].size() == 2);
  MeshtrainRun few = run_meshtrain("simulate --model " + model_file() + " --cluster dgx-a100 --gpus 2 --ep 4");
  CHECK(few.status != 0);
  CHECK_THAT(few.out, Catch::Contains("ep 4 must divide dp 2"));
  MeshtrainRun train = run_meshtrain("train --data " + corpus() + " --model " + model_file() + kArgs +
                                     " --steps 2 --ep 2");
  CHECK(train.status != 0);
  CHECK_THAT(train.out, Catch::Contains("ep 2 must divide dp 1"));
}
