// What a person meets at the command line: --version, every subcommand's
// help with its defaults and an example, the nearest name for a typo, plain
// progress lines in a log, the end-of-run summary, a plan's precision
// honoured or refused, and simulate's errors that say what is missing.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"

namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(" --data ") + MESHTRAIN_SOURCE_DIR + "/README.md";
const std::string kTiny = " --model tiny --seq-len 32 --micro-batch 2 --warmup 0";

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_cli_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The subcommands `meshtrain --help` lists (the lines after "Subcommands:").
std::vector<std::string> listed_subcommands() {
  const MeshtrainRun help = run_meshtrain("--help");
  REQUIRE(help.status == 0);
  std::istringstream lines(help.out.substr(help.out.find("Subcommands:")));
  std::vector<std::string> names;
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    if (words >> name) names.push_back(name);
  }
  return names;
}

// The flag's first column in `help`: "--steps INT:INT in [1, 1073741824]=100"
// (CLI11 pads it to column 30 for the description, or puts that on the next line).
std::string help_line(const std::string& help, const std::string& flag) {
  std::istringstream lines(help);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind("  " + flag + " ", 0) == 0) {
      // A description on the same line starts in column 30.
      const bool described = line.size() > 30 && line[29] == ' ' && line[30] != ' ';
      std::string first = described ? line.substr(2, 27) : line.substr(2);
      return first.substr(0, first.find_last_not_of(' ') + 1);
    }
  return "";
}

}  // namespace

TEST_CASE("version prints the project version", "[cli]") {
  const MeshtrainRun r = run_meshtrain("--version");
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::StartsWith("meshtrain 0.1"));
}

TEST_CASE("every subcommand's help shows its defaults and an example of itself", "[cli]") {
  const std::vector<std::string> subs = listed_subcommands();
  REQUIRE(subs.size() >= 9);
  for (const std::string& sub : subs) {
    INFO(sub);
    const MeshtrainRun r = run_meshtrain(sub + " --help");
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("Example:\n  meshtrain " + sub));
    CHECK_THAT(r.out, Catch::Contains("docs/commands.md"));
  }
  // Defaults, each as its own code sets it.
  const std::string train = run_meshtrain("train --help").out;
  CHECK_THAT(help_line(train, "--steps"), Catch::EndsWith("=100"));
  CHECK_THAT(help_line(train, "--lr"), Catch::EndsWith("=0.001"));
  CHECK_THAT(help_line(train, "--model"), Catch::EndsWith("=tiny"));
  CHECK_THAT(help_line(train, "--adam-beta2"), Catch::EndsWith("=0.95"));
  CHECK_THAT(help_line(train, "--adam-eps"), Catch::EndsWith("=1e-08"));
  CHECK_THAT(help_line(train, "--weight-decay-params"), Catch::EndsWith("=linear"));
  CHECK_THAT(help_line(train, "--lr-decay"), Catch::EndsWith("=cosine"));
  CHECK_THAT(help_line(train, "--tp"), Catch::EndsWith("=1"));
  CHECK_THAT(help_line(train, "--schedule"), Catch::EndsWith("=1f1b"));
  CHECK_THAT(help_line(run_meshtrain("simulate --help").out, "--cluster"), Catch::EndsWith("=dgx-a100"));
  // docs/commands.md gives the same examples.
  std::ifstream doc_file(std::string(MESHTRAIN_SOURCE_DIR) + "/docs/commands.md");
  const std::string doc((std::istreambuf_iterator<char>(doc_file)), std::istreambuf_iterator<char>());
  for (const std::string& sub : subs) {
    const std::string help = run_meshtrain(sub + " --help").out;
    const std::size_t at = help.find("Example:\n  ") + 11;
    INFO(sub);
    CHECK_THAT(doc, Catch::Contains("    " + help.substr(at, help.find('\n', at) - at) + "\n"));
  }
  for (const char* inner : {"train", "encode", "decode"})
    CHECK_THAT(run_meshtrain(std::string("tokenize ") + inner + " --help").out,
               Catch::Contains(std::string("Example:\n  meshtrain tokenize ") + inner));
}

TEST_CASE("a mistyped subcommand or flag names the nearest and the choices", "[cli]") {
  const MeshtrainRun sub = run_meshtrain("trian --steps 3");
  CHECK(sub.status != 0);
  CHECK_THAT(sub.out, Catch::Contains("unknown subcommand 'trian'; did you mean 'train'? subcommands: info, train, "
                                      "simulate"));
  const MeshtrainRun flag = run_meshtrain("train --stepz 3" + kData);
  CHECK(flag.status != 0);
  CHECK_THAT(flag.out, Catch::Contains("meshtrain train: unknown flag '--stepz'; did you mean '--steps'?"));
  // Even where CLI11 would first complain that --data is missing.
  CHECK_THAT(run_meshtrain("train --adam-beta --steps 3").out, Catch::Contains("did you mean '--adam-beta1'?"));
  CHECK_THAT(run_meshtrain("tokenize encod").out, Catch::Contains("did you mean 'encode'? subcommands: train, encode, decode"));
  // Nothing near: no guess, but the list.
  const MeshtrainRun far = run_meshtrain("xyzzyplugh");
  CHECK_THAT(far.out, Catch::Contains("unknown subcommand 'xyzzyplugh'; subcommands: info"));
  CHECK_THAT(far.out, !Catch::Contains("did you mean"));
  CHECK_THAT(run_meshtrain("").out, Catch::Contains("a subcommand is required: info, train"));
}

TEST_CASE("train into a pipe prints plain lines and ends with a summary", "[cli]") {
  const fs::path dir = fresh_dir("summary");
  const std::string metrics = (dir / "m.jsonl").string(), ckpt = (dir / "ckpt").string();
  const MeshtrainRun r = run_meshtrain("train" + kTiny + kData + " --steps 3 --peak-tflops 0.01 --metrics " + metrics +
                                       " --checkpoint " + ckpt);
  REQUIRE(r.status == 0);
  CHECK(r.out.find('\r') == std::string::npos);
  CHECK_THAT(r.out, Catch::Contains("step 3/3 | loss"));
  CHECK_THAT(r.out, Catch::Contains("run summary\n  steps        3 (1..3 of 3)\n"));
  CHECK_THAT(r.out, Catch::Contains("  checkpoint   " + ckpt + " (step 3)\n"));
  CHECK_THAT(r.out, Catch::Contains("  metrics      " + metrics + "\n"));
  CHECK_THAT(r.out, Catch::Contains("of 0.01 peak, from --peak-tflops 0.01 x 1 ranks"));
  // The final loss is the last step's, as --metrics recorded it.
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const double loss = nlohmann::json::parse(last).at("loss").get<double>();
  char expected[64];
  std::snprintf(expected, sizeof expected, "  final loss   %.4f\n", loss);
  CHECK_THAT(r.out, Catch::Contains(expected));
  // Throughput: 3 steps of 2 sequences of 32 tokens.
  CHECK_THAT(r.out, Catch::Contains("(192 tok in "));
  // MFU = tokens/s · model FLOPs per token / peak: the figures the line prints agree.
  const std::string mfu = r.out.substr(r.out.find("  MFU          "));
  double pct = 0, achieved = 0;
  REQUIRE(std::sscanf(mfu.c_str(), "  MFU          %lf%% (%lf model TFLOP/s", &pct, &achieved) == 2);
  // Both printed rounded: the percentage to 0.1, the TFLOP/s to 3 digits.
  CHECK(pct == Approx(100 * achieved / 0.01).epsilon(0.005).margin(0.06));
  const MeshtrainRun bare = run_meshtrain("train" + kTiny + kData + " --steps 2 --quiet");
  CHECK_THAT(bare.out, Catch::Contains("checkpoint   none (no --checkpoint)"));
  CHECK_THAT(bare.out, Catch::Contains("metrics      none (no --metrics)"));
  CHECK_THAT(bare.out, !Catch::Contains("step 1/2"));
}

TEST_CASE("plan's progress line into a pipe is plain lines, never a carriage return", "[cli]") {
  const MeshtrainRun r = run_meshtrain("plan --model tiny --gpus 2 --cluster dgx-a100 --simulate 2 --progress");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("plan: "));
  CHECK(r.out.find('\r') == std::string::npos);
}

TEST_CASE("train --plan honours the plan's precision or refuses it with the reason", "[cli]") {
  const fs::path dir = fresh_dir("precision");
  auto plan_file = [&](const std::string& name, const std::string& body) {
    const fs::path p = dir / name;
    std::ofstream(p) << body;
    return p.string();
  };
  const std::string bf16 = plan_file("bf16.json", R"({"dp": 1, "precision": "bf16"})");
  const MeshtrainRun refused = run_meshtrain("train" + kTiny + kData + " --steps 1 --plan " + bf16);
  CHECK(refused.status != 0);
  CHECK_THAT(refused.out, Catch::Contains("plan file '" + bf16 + "' (\"precision\": \"bf16\") asks for bf16, but the "
                                          "cpu backend trains in fp32 only"));
  CHECK_THAT(refused.out, Catch::Contains("--precision fp32"));
  // The flag overrides the file, as for every plan field.
  CHECK(run_meshtrain("train" + kTiny + kData + " --steps 1 --quiet --plan " + bf16 + " --precision fp32").status == 0);
  const std::string fp32 = plan_file("fp32.json", R"({"dp": 1, "precision": "fp32"})");
  CHECK(run_meshtrain("train" + kTiny + kData + " --steps 1 --quiet --plan " + fp32).status == 0);
  const std::string none = plan_file("none.json", R"({"dp": 1})");
  CHECK(run_meshtrain("train" + kTiny + kData + " --steps 1 --quiet --plan " + none).status == 0);
  CHECK_THAT(run_meshtrain("train" + kTiny + kData + " --steps 1 --backend cuda --precision fp16").out,
             Catch::Contains("--precision fp16 needs loss scaling"));
}

TEST_CASE("simulate says what is missing, and that a default plan does not fit", "[cli]") {
  const MeshtrainRun no_model = run_meshtrain("simulate --cluster local-cpu");
  CHECK(no_model.status != 0);
  CHECK_THAT(no_model.out, Catch::Contains("no model to simulate on cluster 'local-cpu': add --model NAME|FILE"));
  CHECK_THAT(no_model.out, Catch::Contains("gpt2-124m"));
  CHECK_THAT(no_model.out, !Catch::Contains("MFU"));
  // llama3-70b whole on each of 8 A100s: 16 bytes a parameter of state alone is ~1 TiB.
  const MeshtrainRun oom = run_meshtrain("simulate --model llama3-70b --gpus 8");
  CHECK(oom.status != 0);
  CHECK_THAT(oom.out, Catch::Contains("the default plan (tp 1 pp 1 dp 8, ZeRO 0, no recomputation) does not fit"));
  CHECK_THAT(oom.out, Catch::Contains("does not fit llama3-70b: out of memory: rank 0 (pipeline stage 0"));
  CHECK_THAT(oom.out, Catch::Contains("TiB against the A100-SXM4-80GB's capacity of 80.00 GiB"));
  CHECK_THAT(oom.out, Catch::Contains("`meshtrain plan --model llama3-70b --gpus 8 --cluster dgx-a100`"));
  // A plan the user chose gets the simulator's own out-of-memory report instead.
  CHECK_THAT(run_meshtrain("simulate --model llama3-70b --gpus 8 --tp 8").out,
             !Catch::Contains("the default plan"));
}

// A plan file's switches hold unless a flag is given: --tp-comm-overlap once
// overrode the file's "tp_comm_overlap": true with false when it was absent.
TEST_CASE("simulate --plan honours the file's switches as the flags would set them", "[cli]") {
  const fs::path dir = fresh_dir("switches");
  const fs::path plan = dir / "overlap.json";
  std::ofstream(plan) << R"({"tp": 4, "sequence_parallel": true, "tp_comm_overlap": true})";
  const std::string run = "simulate --model gpt2-124m --cluster dgx-h100 --gpus 8";
  auto iteration = [](const MeshtrainRun& r) {
    REQUIRE(r.status == 0);
    const std::size_t at = r.out.find("iteration");
    REQUIRE(at != std::string::npos);
    return r.out.substr(at, r.out.find('\n', at) - at);
  };
  const std::string from_file = iteration(run_meshtrain(run + " --plan " + plan.string()));
  CHECK(from_file == iteration(run_meshtrain(run + " --tp 4 --sequence-parallel --tp-comm-overlap")));
  CHECK(from_file != iteration(run_meshtrain(run + " --tp 4 --sequence-parallel")));
}

// --moe-a2a-overlap reaches the simulation: the all-to-alls of qwen3-30b-a3b over two nodes hide in part.
TEST_CASE("simulate --moe-a2a-overlap times the paired schedule and says where it cannot", "[cli]") {
  const std::string run = "simulate --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --dp 16 --ep 16 "
                          "--precision bf16 --global-batch 64 --seq-len 1024";
  const MeshtrainRun plain = run_meshtrain(run), overlapped = run_meshtrain(run + " --moe-a2a-overlap");
  REQUIRE(plain.status == 0);
  REQUIRE(overlapped.status == 0);
  auto exposed = [](const std::string& out) {
    const std::size_t at = out.find("exposed ", out.find("  all-to-all"));
    REQUIRE(at != std::string::npos);
    return std::stod(out.substr(at + 8));
  };
  CHECK(exposed(overlapped.out) < exposed(plain.out));
  const MeshtrainRun dense = run_meshtrain("simulate --model gpt2-124m --gpus 8 --moe-a2a-overlap");
  CHECK(dense.status != 0);
  CHECK_THAT(dense.out, Catch::Contains("given for a dense model 'gpt2-124m'"));
}

TEST_CASE("train refuses FP8 parameters and says how to run the plan, simulate reports them", "[cli]") {
  const MeshtrainRun r =
      run_meshtrain("train" + kTiny + kData + " --steps 1 --precision fp8 --dp 2 --zero 1 --fp8-param-gather");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("as FP8 parameters (fp8_param_gather)") &&
                        Catch::Contains("without --fp8-param-gather") && Catch::Contains("meshtrain simulate"));
  const MeshtrainRun sim = run_meshtrain(
      "simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --dp 8 --zero 1 --precision fp8 --fp8-param-gather");
  CHECK(sim.status == 0);
  CHECK_THAT(sim.out, Catch::Contains("fp8, FP8 parameters"));
  // A switch given =false clears what a plan file set.
  const fs::path dir = fresh_dir("fp8_params");
  std::ofstream(dir / "plan.json") << R"({"precision": "fp8", "zero": 1, "dp": 2, "fp8_param_gather": true})";
  const std::string plan = " --model tiny --cluster dgx-h100 --gpus 2 --plan " + (dir / "plan.json").string();
  CHECK_THAT(run_meshtrain("simulate" + plan).out, Catch::Contains("FP8 parameters"));
  const MeshtrainRun cleared = run_meshtrain("simulate" + plan + " --fp8-param-gather=false");
  CHECK(cleared.status == 0);
  CHECK_THAT(cleared.out, !Catch::Contains("FP8 parameters"));
  // The last given wins; a value that is no boolean is a usage error naming it (it had aborted the run).
  CHECK_THAT(run_meshtrain("simulate" + plan + " --fp8-param-gather=false --fp8-param-gather").out,
             Catch::Contains("FP8 parameters"));
  const MeshtrainRun bad = run_meshtrain("simulate" + plan + " --fp8-param-gather=maybe");
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("maybe") && Catch::Contains("--fp8-param-gather"));
  CHECK_THAT(bad.out, !Catch::Contains("terminate"));
}

TEST_CASE("train refuses a plan's bf16 gradients and says how to run it", "[cli]") {
  const MeshtrainRun r = run_meshtrain("train" + kTiny + kData + " --steps 1 --precision fp8 --grad-dtype bf16");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("the plan keeps gradients in bf16 (grad_dtype)"));
  CHECK_THAT(r.out, Catch::Contains("--grad-dtype fp32") && Catch::Contains("meshtrain simulate"));
  // simulate takes it, and so does info
  CHECK(run_meshtrain("simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --grad-dtype bf16").status == 0);
  const MeshtrainRun info = run_meshtrain("info --model gpt2-124m --dp 2 --grad-dtype bf16");
  CHECK(info.status == 0);
  CHECK_THAT(info.out, Catch::Contains("bf16 gradients"));
}
