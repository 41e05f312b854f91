// `meshtrain plan` as a user runs it: the table, --json, --explain, --out
// read back by simulate, and named errors for bad flags.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/data/image_dataset.h"
#include "tests/run_meshtrain.h"
#include "tests/training/idx_files.h"

namespace {

// An MNIST-layout set of `n` side × side images (pixels and labels from a fixed sequence: timing and
// running do not depend on them), as train and test sets in a fresh directory.
std::filesystem::path images(const std::string& name, int side, int n) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string pixels, labels;
  for (int i = 0; i < n * side * side; ++i) pixels.push_back(static_cast<char>((i * 2654435761u) >> 24));
  for (int i = 0; i < n; ++i) labels.push_back(static_cast<char>(i % 10));
  const std::vector<std::uint32_t> dims = {std::uint32_t(n), std::uint32_t(side), std::uint32_t(side)};
  for (const char* prefix : {"train", "t10k"}) {
    std::ofstream(dir / (std::string(prefix) + "-images-idx3-ubyte"), std::ios::binary)
        << meshtrain::testing::idx_bytes(meshtrain::kIdxImagesMagic, dims, pixels);
    std::ofstream(dir / (std::string(prefix) + "-labels-idx1-ubyte"), std::ios::binary)
        << meshtrain::testing::idx_bytes(meshtrain::kIdxLabelsMagic, {std::uint32_t(n)}, labels);
  }
  return dir;
}

// `meshtrain args` succeeds; its output (--json) parsed.
nlohmann::json json_output(const std::string& args) {
  const MeshtrainRun r = run_meshtrain(args);
  INFO(r.out);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

// Runs `train` on the cpu backend for 2 steps of `plan` (ranks as threads) and
// returns the steps its metrics file reports a loss for.
int trained_steps(const std::string& model, const std::string& plan, const std::string& data) {
  const std::string metrics =
      (std::filesystem::temp_directory_path() / ("plan_cli_test_metrics_" + model + ".jsonl")).string();
  std::remove(metrics.c_str());
  const MeshtrainRun t = run_meshtrain("train --model " + model + " --plan " + plan + " --data " + data +
                                       " --steps 2 --lr 1e-3 --quiet --metrics " + metrics);
  INFO(t.out);
  REQUIRE(t.status == 0);
  std::ifstream lines(metrics);
  int steps = 0;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) steps += nlohmann::json::parse(line).contains("loss") ? 1 : 0;
  return steps;
}

// The plan file `out` holds the report row `best`'s plan, and `simulate` reads
// it unchanged: the same DES time as the planner's full tier.
void check_plan_file(const std::string& model, const std::string& out, const nlohmann::json& best) {
  std::ifstream written(out);
  REQUIRE(written.good());
  CHECK(nlohmann::json::parse(written) == best["plan"]);
  const auto simulated = json_output("simulate --model " + model + " --cluster local-cpu --gpus 4 --json --plan " + out);
  CHECK(simulated["iteration_time_s"].get<double>() == Approx(best["iteration_time_s"].get<double>()).epsilon(1e-12));
}

// The planner's winner as written to `out` (the row `best`) read by simulate, and trained for 2 steps on the cpu
// backend over a synthetic IDX set of `side` × `side` images.
void check_written_plan_runs(const std::string& model, const std::string& out, const nlohmann::json& best, int side) {
  check_plan_file(model, out, best);
  const auto data = images("plan_cli_test_images_" + model, side, 64);
  CHECK(trained_steps(model, out, data.string()) == 2);
  std::remove(out.c_str());
  std::filesystem::remove_all(data);
}

}  // namespace

TEST_CASE("plan prints a ranked table, explains the winner and writes a plan file simulate reads unchanged") {
  const std::string out = "plan_cli_test_winner.json";
  std::remove(out.c_str());
  const MeshtrainRun r = run_meshtrain("plan --model tiny --gpus 8 --global-batch 32 --simulate 8 --top 3 "
                                       "--explain --no-progress --out " + out);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("searched") && Catch::Contains("  1  tp ") && Catch::Contains("why tp ") &&
                        Catch::Contains("bubble: compute stream idle") && Catch::Contains("wrote the winner"));
  const auto report = json_output("plan --model tiny --gpus 8 --global-batch 32 --simulate 8 --json --no-progress");
  const double best = report["ranked"][0]["iteration_time_s"].get<double>();
  const auto simulated = json_output("simulate --model tiny --cluster dgx-a100 --gpus 8 --json --plan " + out);
  CHECK(simulated["iteration_time_s"].get<double>() == Approx(best).epsilon(1e-12));
  std::remove(out.c_str());
}

TEST_CASE("plan refuses bad flags by name") {
  const MeshtrainRun dim = run_meshtrain("plan --model tiny --gpus 8 --fix tq=2");
  CHECK(dim.status == 1);
  CHECK_THAT(dim.out, Catch::Contains("unknown plan dimension 'tq'") && Catch::Contains("did you mean 'tp'"));
  const MeshtrainRun contradict = run_meshtrain("plan --model tiny --gpus 8 --fix tp=2 --fix tp=4");
  CHECK(contradict.status == 1);
  CHECK_THAT(contradict.out, Catch::Contains("--fix tp=2 and --fix tp=4 contradict"));
  const MeshtrainRun fits = run_meshtrain("plan --model gpt3-175b --gpus 8 --no-progress");
  CHECK(fits.status == 1);
  CHECK_THAT(fits.out, Catch::Contains("no plan of gpt3-175b on 8 GPUs fits") && Catch::Contains("short"));
  const MeshtrainRun gpus = run_meshtrain("plan --model tiny");
  CHECK(gpus.status != 0);
  CHECK_THAT(gpus.out, Catch::Contains("--gpus"));
}

TEST_CASE("plan searches a Swin's segment layouts and the chosen one simulates and trains on the cpu backend as written") {
  const std::string out = "plan_cli_test_segments.json";
  std::remove(out.c_str());
  const std::string job = "--model swin-micro --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8 ";
  const auto report =
      json_output("plan " + job + "--layouts segments --segments 6 --json --no-progress --top 100 --out " + out);
  const auto& family = report["search"]["segment_layouts"];
  CHECK(family["valid"].get<int>() > 6);
  CHECK(family["simulated"].get<int>() == 6);
  int timed = 0;  // the DES's six first, then the rest of the family by the fast tier
  for (const auto& row : report["ranked"]) timed += row.contains("iteration_time_s") ? 1 : 0;
  CHECK(timed == 6);
  CHECK(static_cast<int>(report["ranked"].size()) == std::min(100, family["estimated"].get<int>()));
  const auto& best = report["ranked"][0];
  CHECK(best["layout"] == "segments");
  CHECK(best["fast_iteration_time_s"].get<double>() > 0);  // the fast tier ranked the family
  const auto& segments = best["plan"]["segments"];
  REQUIRE(segments.size() == 2);
  // The two segments cover the blocks 0..9 (embedding, 3 stages of 2 blocks and their merges, head) in order.
  CHECK(segments[0]["blocks"][0] == 0);
  CHECK(segments[1]["blocks"][0].get<int>() == segments[0]["blocks"][1].get<int>() + 1);
  check_written_plan_runs("swin-micro", out, best, 12);
}

TEST_CASE("under fp8 plan writes a segment layout's FP8 parameters into its plan file, which simulate reads") {
  const std::string out = "plan_cli_test_segments_fp8.json";
  const auto report = json_output("plan --model swin-micro --cluster dgx-h100 --precision fp8 --gpus 4 --global-batch 8 "
                                  "--layouts segments --segments 6 --json --no-progress --top 100");
  int kept = 0;
  for (const auto& row : report["ranked"]) {
    const bool fp8_params = row["summary"].get<std::string>().find("fp8-params") != std::string::npos;
    CHECK(row["plan"].value("fp8_param_gather", false) == fp8_params);  // the whole plan's field
    if (!fp8_params || kept++ > 0) continue;
    {
      std::ofstream f(out);
      f << row["plan"].dump();
    }
    const auto simulated = json_output("simulate --model swin-micro --cluster dgx-h100 --gpus 4 --json --plan " + out);
    CHECK(simulated["iteration_time_s"].get<double>() > 0);
    std::remove(out.c_str());
  }
  CHECK(kept > 0);
}

TEST_CASE("plan ranks segment layouts beside uniform plans and leaves them out under a pinned tp") {
  const std::string job = "plan --model swin-micro --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8 "
                          "--simulate 4 --segments 3 --json --no-progress --top 1000";
  const auto report = json_output(job);
  int segmented = 0, timed = 0;
  double previous = 0;
  for (const auto& row : report["ranked"]) {
    if (!row.contains("iteration_time_s")) continue;
    segmented += row["layout"] == "segments" ? 1 : 0;
    // The full tier's candidates of both kinds come first, in one order.
    CHECK(row["iteration_time_s"].get<double>() >= previous);
    previous = row["iteration_time_s"].get<double>();
    ++timed;
  }
  CHECK(segmented == 3);
  CHECK(timed == 7);
  CHECK(json_output(job + " --fix tp=1")["search"]["segment_layouts"]["formed"] == 0);
  const MeshtrainRun bad = run_meshtrain(job + " --layouts segmented");
  CHECK(bad.status == 1);
  CHECK_THAT(bad.out, Catch::Contains("--layouts") && Catch::Contains("segments"));
}

TEST_CASE("plan writes context parallelism, compression and the overlapped update to a plan file that simulate and train take unchanged") {
  const std::string out = "plan_cli_test_dims.json";
  std::remove(out.c_str());
  const std::string job = "--model tiny --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8 ";
  const auto best = json_output("plan " + job +
                                "--fix cp=2,tp=1,pp=1,grad_compression=bf16 --simulate 4 --json --no-progress --out " +
                                out)["ranked"][0];
  CHECK(best["plan"]["cp"] == 2);
  CHECK(best["plan"]["dp"] == 2);
  CHECK(best["plan"]["grad_compression"] == "bf16");
  CHECK(best["plan"]["overlap_update"] == true);
  check_plan_file("tiny", out, best);

  // train: ranks as threads on the cpu backend; a language model's tokens are any file's bytes.
  const auto data = std::filesystem::temp_directory_path() / "plan_cli_test_tokens.bin";
  {
    std::ofstream f(data, std::ios::binary);
    for (int i = 0; i < 1 << 16; ++i) f.put(static_cast<char>((i * 2654435761u) >> 24));
  }
  CHECK(trained_steps("tiny", out, data.string()) == 2);
  std::remove(out.c_str());
  std::filesystem::remove(data);
}

TEST_CASE("plan finds a three-segment VQA layout that simulate and train read as written", "[segments]") {
  const std::string out = "plan_cli_test_vqa3.json";
  std::remove(out.c_str());
  // The mission's layout: the vision encoder on a tensor-parallel group, the language model on a pipeline group.
  const std::string job = "--model vqa-tiny --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8 ";
  const auto report = json_output("plan " + job +
                                  "--fix segments.count=3,vision.tp=2,vision.gpus=2,language.pp=2 --segments 4 "
                                  "--json --no-progress --top 100 --out " + out);
  REQUIRE(!report["ranked"].empty());
  for (const auto& row : report["ranked"]) {
    REQUIRE(row["layout"] == "segments");
    const auto& segs = row["plan"]["segments"];
    REQUIRE(segs.size() == 3);
    CHECK(segs[0]["name"] == "vision");
    CHECK(segs[0]["tp"] == 2);
    CHECK(segs[0]["ranks"] == nlohmann::json::array({0, 1}));
    CHECK(segs[2]["name"] == "language");
    CHECK(segs[2]["pp"] == 2);
    CHECK(segs[2]["ranks"] == nlohmann::json::array({2, 3}));
  }
  // Garments of 28×28 (vqa-tiny's 2×2 grids of them).
  check_written_plan_runs("vqa-tiny", out, report["ranked"][0], 28);
}

TEST_CASE("plan honors pins on segment degrees and names contradictions", "[segments]") {
  const std::string job = "plan --model swin-micro --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8 "
                          "--simulate 2 --segments 2 --json --no-progress --top 100000 ";
  const auto report = json_output(job + "--fix stage3.pp=2,embed.tp=2 --allow stage1.zero=0,1");
  int rows = 0;
  for (const auto& row : report["ranked"]) {
    REQUIRE(row["layout"] == "segments");  // only segment items: only segment layouts
    const auto& segs = row["plan"]["segments"];
    const auto holding = [&](const std::string& module) {
      // swin-micro's blocks: 0 embed, 1-2 stage1, 3 merge, 4-5 stage2, 6 merge, 7-8 stage3, 9 head; "name" lists
      // a segment's first and last modules.
      for (const auto& seg : segs) {
        const std::string name = seg["name"];
        const int first = seg["blocks"][0], last = seg["blocks"][1];
        const int block = module == "embed" ? 0 : module == "stage1" ? 1 : 7;
        if (block >= first && block <= last) return seg;
      }
      FAIL("no segment holds " << module);
      return segs[0];
    };
    CHECK(holding("stage3").value("pp", 1) == 2);
    CHECK(holding("embed")["tp"] == 2);
    CHECK(holding("stage1").value("zero", 0) <= 1);
    ++rows;
  }
  CHECK(rows > 2);

  const struct {
    std::string flags, says;
  } bad[] = {
      {"--fix stage1.tp=2,stage1.tp=4", "contradict"},
      {"--fix stage1.tp=8", "needs a multiple of 8 GPUs"},
      {"--fix stage1.tp=2,stage1.pp=1,stage1.dp=1,stage1.gpus=4", "contradict"},
      {"--fix stag1.tp=2", "did you mean 'stage1'"},
      {"--fix stage1.tpp=2", "did you mean 'tp'"},
      {"--fix stage1.zero=1 --allow stage1.zero=2,3", "outside --allow"},
      {"--fix segments.count=1", "2 or 3 segments"},
      {"--fix stage1.tp=2 --layouts uniform", "--layouts uniform"},
      // The mirror: a uniform plan's pin under --layouts segments is refused, not dropped.
      {"--fix tp=2 --layouts segments", "pin uniform plans, which --layouts segments leaves out"},
      // Two pins that no layout can meet: embed and head in one segment with different tp.
      {"--fix segments.count=2,embed.tp=2,stage1.tp=4,stage2.tp=1,stage3.tp=2,head.tp=4", "no valid segment layout"},
  };
  for (const auto& b : bad) check_refused(job + b.flags, b.says);
  const MeshtrainRun decoder = run_meshtrain("plan --model tiny --gpus 4 --fix embed.tp=2 --no-progress");
  CHECK(decoder.status == 1);
  CHECK_THAT(decoder.out, Catch::Contains("no segment layouts"));
}

TEST_CASE("the segment layouts' fast tier ranks small families as the DES does, within a stated error", "[segments]") {
  // Every layout of each family is timed by both tiers (RESULTS.md, "Segment layouts: the fast tier": the whole
  // families measured 0.96-0.99 Spearman, worst 24-39%; these two 0.874 / 23.9% and 0.947 / 10.9%).
  const struct {
    std::string job;
    double spearman, worst;
  } families[] = {
      {"--model swin-micro --gpus 4 --global-batch 8 --fix segments.microbatches=2", 0.8, 0.30},
      {"--model vqa-tiny --gpus 4 --global-batch 8 --fix segments.count=3,segments.microbatches=2,vision.gpus=2", 0.9,
       0.20},
  };
  for (const auto& f : families) {
    INFO(f.job);
    const auto report = json_output("plan " + f.job +
                                    " --cluster local-cpu --precision fp32 --layouts segments --segments 100000 "
                                    "--json --no-progress --top 1");
    const auto& a = report["segment_agreement"];
    CHECK(a["compared"].get<int>() == report["search"]["segment_layouts"]["estimated"].get<int>());
    CHECK(a["compared"].get<int>() > 20);
    CHECK(a["spearman"].get<double>() >= f.spearman);
    CHECK(a["worst_relative_error"].get<double>() <= f.worst);
  }
}

TEST_CASE("plan keeps --grad-dtype bf16 in every candidate and writes it to the plan file", "[planner]") {
  const std::string out = "plan_cli_test_grads.json";
  std::remove(out.c_str());
  const std::string job = "plan --model tiny --cluster local-cpu --gpus 4 --global-batch 8 --fix tp=1,pp=1,zero=1 "
                          "--simulate 2 --json --no-progress ";
  const nlohmann::json bf16 = json_output(job + "--grad-dtype bf16 --out " + out);
  const nlohmann::json fp32 = json_output(job);
  REQUIRE(!bf16["ranked"].empty());
  for (const auto& row : bf16["ranked"]) CHECK(row["plan"]["grad_dtype"] == "bf16");
  for (const auto& row : fp32["ranked"]) CHECK_FALSE(row["plan"].contains("grad_dtype"));
  // Half the data-parallel bytes: the same plan is no slower with bf16 gradients.
  CHECK(bf16["ranked"][0]["iteration_time_s"].get<double>() <= fp32["ranked"][0]["iteration_time_s"].get<double>());
  check_plan_file("tiny", out, bf16["ranked"][0]);
  std::remove(out.c_str());
}

TEST_CASE("plan keeps --fp8-recipe current in every candidate, and refuses it without --precision fp8", "[planner]") {
  const std::string job = "plan --model tiny --cluster dgx-h100 --gpus 4 --global-batch 8 --fix tp=2,pp=1 "
                          "--simulate 2 --json --no-progress ";
  const nlohmann::json current = json_output(job + "--precision fp8 --fp8-recipe current");
  const nlohmann::json delayed = json_output(job + "--precision fp8");
  REQUIRE(!current["ranked"].empty());
  for (const auto& row : current["ranked"]) CHECK(row["plan"]["fp8_recipe"] == "current");
  for (const auto& row : delayed["ranked"]) CHECK_FALSE(row["plan"].contains("fp8_recipe"));
  const MeshtrainRun refused = run_meshtrain(job + "--fp8-recipe current");
  CHECK(refused.status != 0);
  CHECK_THAT(refused.out, Catch::Contains("fp8_recipe (--fp8-recipe) current scales FP8 tensors, but the plan's "
                                          "precision is bf16: add --precision fp8"));
}

TEST_CASE("plan runs --recompute-modules in every candidate and writes them to the plan file", "[planner]") {
  const std::string out = "plan_cli_test_modules.json";
  std::remove(out.c_str());
  const std::string job = "plan --model tiny-moe --cluster local-cpu --gpus 4 --global-batch 8 --fix tp=1,pp=1 "
                          "--allow recompute=none,full --simulate 2 --json --no-progress ";
  const nlohmann::json with = json_output(job + "--recompute-modules layernorm,moe_act --out " + out);
  REQUIRE(!with["ranked"].empty());
  for (const auto& row : with["ranked"])
    CHECK(row["plan"]["recompute_modules"] == nlohmann::json({"layernorm", "moe_act"}));
  check_plan_file("tiny-moe", out, with["ranked"][0]);
  std::remove(out.c_str());
  const MeshtrainRun dense = run_meshtrain("plan --model tiny --cluster local-cpu --gpus 2 --simulate 1 --no-progress "
                                           "--recompute-modules moe_act");
  CHECK(dense.status != 0);
  CHECK_THAT(dense.out, Catch::Contains("has no experts"));
}
