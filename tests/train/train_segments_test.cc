// `meshtrain train --plan FILE` with "segments": the same run as one rank
// (losses and validation), resumable, and a layout that cannot run is
// refused by name before anything trains.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return meshtrain::testing::scratch_path("segments-test", name); }

fs::path write(const std::string& name, const std::string& text) {
  fs::path p = scratch(name);
  std::ofstream(p) << text;
  return p;
}

std::vector<nlohmann::json> records(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The tiny decoder untied (tied embeddings must stay in one segment).
const char* kModel =
    R"({"name": "tiny-untied", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
        "tied_embeddings": false})";

// Blocks 0-2 on two tensor-parallel ranks, 3-5 on four more (pp 2 × dp 2).
const char* kPlan = R"({"global_batch": 8, "micro_batch": 2, "precision": "fp32", "segments": [
    {"name": "front", "blocks": [0, 2], "tp": 2, "sequence_parallel": true, "ranks": [0, 1]},
    {"name": "back", "blocks": [3, 5], "pp": 2, "dp": 2, "microbatches": 2, "ranks": [2, 5]}]})";

const std::string kData = std::string(" --data ") + MESHTRAIN_SOURCE_DIR + "/README.md";

}  // namespace

TEST_CASE("a plan made of segments trains as one rank does, and resumes", "[train][segments]") {
  const fs::path model = write("model.json", kModel), plan = write("plan.json", kPlan);
  const std::string common = " --model " + model.string() + kData + " --seq-len 32 --eval-every 5 --quiet";
  const fs::path one = scratch("one.jsonl"), seg = scratch("seg.jsonl"), ck = scratch("ck");
  auto r = run_meshtrain("train" + common + " --micro-batch 2 --global-batch 8 --precision fp32 --steps 10 "
                         "--metrics " + one.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  // Five steps, a checkpoint, then five more resumed.
  r = run_meshtrain("train" + common + " --plan " + plan.string() + " --steps 10 --stop-at 5 --checkpoint " +
                    ck.string() + " --metrics " + seg.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = run_meshtrain("train" + common + " --plan " + plan.string() + " --steps 10 --resume --checkpoint " +
                    ck.string() + " --metrics " + seg.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto a = records(one), b = records(seg);
  REQUIRE(a.size() == 10);
  REQUIRE(b.size() == 10);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(b[i]["loss"].get<double>() == Approx(a[i]["loss"].get<double>()).epsilon(1e-5));
    if (a[i].contains("val_loss"))
      CHECK(b[i]["val_loss"].get<double>() == Approx(a[i]["val_loss"].get<double>()).epsilon(1e-5));
  }
}

TEST_CASE("a segment layout that cannot run is refused naming the segment", "[train][segments]") {
  const fs::path model = write("model2.json", kModel);
  auto refused = [&](const std::string& segments) {
    const fs::path plan = write("bad.json", R"({"global_batch": 8, "micro_batch": 2, "segments": )" + segments + "}");
    const auto r = run_meshtrain("train --model " + model.string() + kData + " --steps 1 --plan " + plan.string());
    CHECK(r.status != 0);
    return r.out;
  };
  CHECK_THAT(refused(R"([{"blocks": [0, 2]}, {"blocks": [4, 5]}])"),
             Catch::Contains("segment 1 ('segment 1') starts at block 4") && Catch::Contains("ends at block 2"));
  CHECK_THAT(refused(R"([{"blocks": [0, 2], "tp": 2}, {"blocks": [3, 5], "ranks": [1, 1]}])"),
             Catch::Contains("must share their ranks or use disjoint ones"));
  CHECK_THAT(refused(R"([{"modules": ["embed", "nope"]}, {"blocks": [1, 5]}])"),
             Catch::Contains("module") && Catch::Contains("nope"));
  CHECK_THAT(refused(R"([{"blocks": [0, 5], "ranks": [1, 1]}])"), Catch::Contains("rank 0 is in no segment"));
  CHECK_THAT(refused(R"([{"blocks": [0, 2], "dp": 3}, {"blocks": [3, 5], "dp": 3}])"),
             Catch::Contains("does not split into dp 3"));
  CHECK_THAT(refused(R"([{"blocks": [0, 2], "cp": 2}, {"blocks": [3, 5]}])"), Catch::Contains("whole plan"));
  // The gradients' dtype is the whole plan's, where train refuses bf16 (a segment's own once got past it).
  CHECK_THAT(refused(R"([{"blocks": [0, 2], "grad_dtype": "bf16"}, {"blocks": [3, 5]}])"),
             Catch::Contains("'grad_dtype' is the whole plan's"));
  CHECK_THAT(refused(R"([{"blocks": [0, 2], "fp8_param_gather": true}, {"blocks": [3, 5]}])"),
             Catch::Contains("'fp8_param_gather' is the whole plan's"));
  // Tied embeddings keep the embedding and the head together.
  const auto r = run_meshtrain("train --model tiny" + kData + " --steps 1 --plan " +
                               write("tied.json", R"({"segments": [{"blocks": [0, 2]}, {"blocks": [3, 5]}]})").string());
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("ties its embedding and head"));
}
