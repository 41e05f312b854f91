// Every JSON input (model, plan, cluster, calibration, checkpoint manifest)
// goes through one reader: malformed, extreme and special files are refused
// by name. Before: 100k nested brackets were a SIGSEGV, 1e400 a `terminate`,
// {"tp": 4294967297} ran as tp 1, a FIFO blocked forever, /dev/zero ate memory.
// The readers added since (MoE routing files, plan segments) and every output
// a user names (traces, metrics, plan and calibration files) take the same paths.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

namespace {

struct Input {
  const char* kind;      // how messages name the file
  std::string command;   // runs meshtrain with the file appended
  const char* valid;     // a valid file's body, to put numbers in
};

std::vector<Input> inputs() {
  return {
      {"model file", "info --model ", R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64, "X": 1})"},
      {"plan file", "info --model tiny --plan ", R"({"tp": 1, "X": 1})"},
      {"cluster file", "simulate --model tiny --gpus 1 --cluster ", R"({"base": "dgx-a100", "X": 1})"},
      {"calibration file", "simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration ",
       R"({"version": 1, "X": 1})"},
      {"routing file", "simulate --model tiny-moe --gpus 8 --cluster h200 --moe-routing file:",
       R"([1, 1, 1, 1, 1, 1, 1, {"X": 1}])"},
      {"job file", "simulate --cluster h200 --job ", R"({"model": "tiny", "gpus": "0-7", "X": 1})"},
  };
}

}  // namespace

TEST_CASE("deep nesting, huge numbers and junk in any JSON input are errors", "[reliability][json]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const Input& in : inputs()) {
    INFO(in.kind);
    auto with = [&](const std::string& name, const std::string& value) {
      std::string body = in.valid;
      body.replace(body.find("\"X\": 1"), 6, value);
      return write_text(name + ".json", body);
    };
    expect_refusal(in.command + with("deep", "\"X\": " + deep), "nests deeper than 64 levels");
    expect_refusal(in.command + with("overflow", "\"X\": 1e400"), "is not valid JSON: number overflow");
    expect_refusal(in.command + write_text("junk.json", std::string("\x7f" "ELF\x02\x01\x01", 7)), "is not valid JSON");
    expect_refusal(in.command + write_text("empty.json", ""), "is not valid JSON");
  }
  // Numbers beyond range name the field and its range (they wrapped or truncated before).
  expect_refusal("info --model tiny --plan " + write_text("tp.json", R"({"tp": 4294967297})"),
                 "plan field 'tp' must be an integer in [1, 1048576], got 4294967297");
  expect_refusal("info --model " + write_text("layers.json", R"({"layers": 2147483648, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64})"),
                 "model field 'layers' must be an integer in [1, 65536], got 2147483648");
  expect_refusal("info --model " + write_text("eps.json", R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64, "norm_eps": 1e-300})"),
                 "model field 'norm_eps' must be a number in [1e-20, 1], got 1e-300");
  expect_refusal("simulate --model tiny --gpus 8 --cluster " + write_text("c.json", R"({"base": "dgx-a100", "nvlink_GBps": 1e-300})"),
                 "field 'nvlink_GBps' must be a number in [0.001, 10000000]");
  expect_refusal("simulate --model tiny --gpus 8 --cluster " + write_text("c2.json", R"({"base": "dgx-a100", "device": {"memory_GiB": 1e300}})"),
                 "field 'memory_GiB' must be a number in [0.001, 10000000]");
  expect_refusal("simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration " +
                     write_text("cal.json", R"({"version": 1, "gemm": [{"m": 4, "n": 4, "k": 4, "time_us": 1e300}]})"),
                 "gemm[0]: field 'time_us' must be a number in [0.001, 1000000000], got 1e+300");
}

TEST_CASE("special files as JSON inputs: refused by kind, never blocking", "[reliability][json]") {
  const fs::path dir = scratch("dir.json");
  fs::create_directories(dir);
  const fs::path fifo = scratch("fifo.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  for (const Input& in : inputs()) {
    INFO(in.kind);
    expect_refusal(in.command + dir.string(), std::string(in.kind) + " '" + dir.string() + "' is a directory");
    expect_refusal(in.command + fifo.string(), "is a FIFO (named pipe), not a regular file");
    expect_refusal(in.command + "/dev/zero", std::string(in.kind) + " '/dev/zero' is a character device");
  }
}

TEST_CASE("a checkpoint manifest goes through the same reader", "[reliability][json]") {
  const fs::path dir = scratch("deep-manifest");
  fs::create_directories(dir);
  std::ofstream(dir / "manifest.json") << "{\"format\": \"meshtrain-checkpoint\", \"rng\": " << std::string(100000, '[')
                                       << std::string(100000, ']') << "}";
  expect_refusal(tiny_train() + " --steps 2 --resume --checkpoint " + dir.string(), "nests deeper than 64 levels");
  fs::remove(dir / "manifest.json");
  fs::create_directory(dir / "manifest.json");
  expect_refusal(tiny_train() + " --steps 2 --resume --checkpoint " + dir.string(), "manifest.json");
}

TEST_CASE("a calibration of another device is refused, the report says what came from defaults", "[reliability][json]") {
  // A cpu-backend calibration on a GPU cluster: times of another machine.
  const std::string cpu_cal = write_text(
      "cpu-cal.json", R"j({"version": 1, "device": "AMD EPYC (2 cores, cpu backend)", "machine": {"backend": "cpu"},
                           "gemm": [{"m": 64, "n": 64, "k": 64, "dtype": "fp32", "time_us": 20}]})j");
  expect_refusal("simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration " + cpu_cal,
                 "the calibration was measured by the cpu backend (on 'AMD EPYC (2 cores, cpu backend)'), but "
                 "cluster 'dgx-a100' has GPU devices ('A100-SXM4-80GB')");
  const std::string h100_cal = write_text(
      "h100-cal.json", R"j({"version": 1, "device": "NVIDIA H100 80GB HBM3 (cuda backend)", "precision": "bf16",
                             "machine": {"backend": "cuda"}})j");
  expect_refusal("simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration " + h100_cal,
                 "but cluster 'dgx-a100' has 'A100-SXM4-80GB' devices");
  CHECK(run_meshtrain("simulate --model tiny --gpus 8 --cluster dgx-h100 --calibration " + h100_cal).status == 0);
  // On its own machine it is used, and the tables it lacks are named.
  const MeshtrainRun r =
      run_meshtrain("simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration " + cpu_cal);
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("measured gemm fp32 (1 shapes); cost-model defaults for grouped gemm fp32 (tile "
                                    "model), attention forward, attention backward, memory-bound ops"));
  const MeshtrainRun j = run_meshtrain(
      "simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --json --calibration " + cpu_cal);
  REQUIRE(j.status == 0);
  const auto json = nlohmann::json::parse(j.out);
  CHECK(json.at("calibration").at("measured") == nlohmann::json::array({"gemm fp32 (1 shapes)"}));
  CHECK(json.at("calibration").at("defaults").size() > 5);
}

TEST_CASE("a plan's segments and a routing file read their numbers through the bounded reader", "[reliability][json]") {
  // Before: 2^32 wrapped to 0 (one rank, accepted), dp 2^20 times 4096 micro-batches wrapped to 0 and
  // divided (SIGFPE), eight shares of 1e308 summed to inf and routed every token nowhere.
  auto plan = [](const std::string& name, const std::string& segment) {
    return "simulate --model swin-fmnist --plan " + write_text(name, R"({"segments": [)" + segment + "]}");
  };
  expect_refusal(plan("ranks.json", R"({"blocks": [0, 14], "ranks": [0, 4294967296]})"),
                 "segment 0: \"ranks\" last must be an integer in [0, 1048575], got 4294967296");
  expect_refusal(plan("blocks.json", R"({"blocks": [0, 99999999999]})"),
                 "segment 0: \"blocks\" last must be an integer in [0, 14], got 99999999999");
  expect_refusal(plan("microbatches.json", R"({"blocks": [0, 14], "microbatches": 4294967297})"),
                 "segment 0: \"microbatches\" must be an integer in [1, 1073741824], got 4294967297");
  expect_refusal(plan("product.json", R"({"blocks": [0, 14], "dp": 1048576, "microbatches": 4096})"),
                 "does not split into dp 1048576 × 4096 micro-batches");
  // A whole plan's degree beside "segments" was accepted and ignored (each segment lays itself out).
  const std::string hetero = std::string(MESHTRAIN_SOURCE_DIR) + "/experiments/plans/vqa-hetero.json";
  expect_refusal("simulate --model vqa-tiny --tp 2 --plan " + hetero,
                 "--tp sets it for the whole plan, but a plan of \"segments\" lays out each segment itself");
  expect_refusal("simulate --model swin-fmnist --plan " +
                     write_text("whole-tp.json", R"({"tp": 2, "segments": [{"blocks": [0, 14], "tp": 2}]})"),
                 "whole-tp.json' sets \"tp\" for the whole plan, but a plan of \"segments\"");
  CHECK(run_meshtrain("simulate --model vqa-tiny --gpus 6 --plan " + hetero).status == 0);
  expect_refusal("simulate --model tiny-moe --gpus 8 --cluster h200 --moe-routing file:" +
                     write_text("shares.json", "[1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308]"),
                 "a share must be a finite number in [0, ");
}

TEST_CASE("special files as outputs: refused by kind before the work, never blocking", "[reliability][json]") {
  const fs::path fifo = scratch("out-fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const std::string f = fifo.string();
  expect_refusal(tiny_train() + " --steps 1 --metrics " + f, "--metrics file '" + f + "' is a FIFO (named pipe)");
  expect_refusal(tiny_train() + " --steps 1 --trace " + f, "trace file '" + f + "' is a FIFO (named pipe)");
  expect_refusal("simulate --model tiny --gpus 8 --trace " + f, "--trace file '" + f + "' is a FIFO (named pipe)");
  expect_refusal("plan --model tiny --gpus 2 --out " + f, "--out plan file '" + f + "' is a FIFO (named pipe)");
  expect_refusal("calibrate --backend cpu --quick --out " + f, "--out calibration file '" + f + "' is a FIFO");
  // Unwritable: the OS's reason, before the search or simulation.
  expect_refusal("plan --model tiny --gpus 2 --out /proc/none/plan.json",
                 "cannot write --out plan file '/proc/none/plan.json': No such file or directory");
  expect_refusal("simulate --model tiny --gpus 8 --trace /proc/none/t.json",
                 "cannot write --trace file '/proc/none/t.json': No such file or directory");
}
