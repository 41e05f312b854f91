// Issue 29, class 5: messages name the real cause. Before: `--straggler -1:2`
// said "got ''", a four-field workload complained about its micro-batch "2:16",
// a segment of no modules said it started at block 9, an A100 calibration with
// backend cpu on dgx-a100 reported a device mismatch between identical
// devices, and a non-finite step under --overlap-update claimed the
// parameters were those of the step before.
#include <cctype>
#include <sstream>

#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

TEST_CASE("a negative rank or count says it is negative", "[reliability][messages]") {
  expect_refusal("simulate --model tiny --cluster h200 --gpus 8 --straggler -1:2",
                 "--straggler '-1:2': rank -1 is negative; ranks are 0..7");
  expect_refusal("info --model tiny --rank -1", "--rank: is negative (-1); it must be an integer in [0, 1048575]");
  expect_refusal(tiny_train() + " --steps 2 --fault-inject -1:exit:1", "the rank is negative (-1)");
  expect_refusal(tiny_train() + " --steps 1 --seed -1", "--seed: is negative (-1)");
  expect_refusal("info --model " + write_text("neg.json", R"({"layers": -2, "hidden": 64, "heads": 4, "vocab": 256,
                                                              "seq_len": 64})"),
                 "model field 'layers' is negative (-2); it must be an integer in [1, 65536]");
}

TEST_CASE("a workload with too many fields says so", "[reliability][messages]") {
  expect_refusal("calibrate --backend cpu --quick --out " + scratch("w.json").string() + " --workload tiny:2:16:5",
                 "--workload 'tiny:2:16:5' has 4 fields; it takes at most 3");
}

TEST_CASE("a segment with no modules says it is empty", "[reliability][messages]") {
  expect_refusal("simulate --model vqa-tiny --plan " +
                     write_text("empty-seg.json", R"({"segments": [{"modules": []}, {"modules": ["vision", "projector", "language"]}]})"),
                 "segment 0: \"modules\" is empty, so the segment holds no blocks");
}

TEST_CASE("a calibration refused for its backend says backend", "[reliability][messages]") {
  const std::string a100_cpu = write_text("a100-cpu.json", R"({"version": 1, "device": "A100-SXM4-80GB", "machine": {"backend": "cpu"}})");
  const MeshtrainRun r = run_meshtrain("simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration " + a100_cpu);
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("machine.backend is \"cpu\""));
  CHECK_THAT(r.out, !Catch::Contains("but cluster 'dgx-a100' has 'A100-SXM4-80GB' devices"));
  const std::string cpu = write_text("cpu.json", R"j({"version": 1, "device": "AMD EPYC (2 cores, cpu backend)", "machine": {"backend": "cpu"}})j");
  expect_refusal("simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration " + cpu,
                 "the calibration was measured by the cpu backend (on 'AMD EPYC (2 cores, cpu backend)'), but cluster "
                 "'dgx-a100' has GPU devices");
}

namespace {

// The bytes that the message's breakdown prints as "<name> 1.23 GiB" (human_bytes), or -1.
double bytes_after(const std::string& text, const std::string& name) {
  const std::size_t breakdown = text.find("Breakdown of the rank: ");
  if (breakdown == std::string::npos) return -1;
  const std::size_t at = text.find(name + " ", breakdown);
  if (at == std::string::npos) return -1;
  std::istringstream in(text.substr(at + name.size() + 1));
  double value = 0;
  std::string unit;
  if (!(in >> value >> unit)) return -1;
  const std::string units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  for (const std::string& u : units) {
    if (unit.starts_with(u) && (unit.size() == u.size() || !std::isalpha(static_cast<unsigned char>(unit[u.size()]))))
      return value;
    value *= 1024;
  }
  return -1;
}

// Expects an out-of-memory refusal, exit status 1, naming all four things.
std::string expect_oom(const std::string& args, const std::string& rank, const std::string& capacity,
                       const std::string& consumer) {
  INFO("meshtrain " << args);
  const MeshtrainRun r = run_meshtrain(args);
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("out of memory: " + rank));
  CHECK_THAT(r.out, Catch::Contains("peaks at an estimated "));
  CHECK_THAT(r.out, Catch::Contains("against " + capacity + "'s capacity of "));
  CHECK_THAT(r.out, Catch::Contains("its largest consumer is the " + consumer + " ("));
  return r.out;
}

}  // namespace

TEST_CASE("out of memory names the rank, its peak against capacity and the largest consumer", "[reliability][messages]") {
  // gpt3-175b over tp 8 in bf16: 21.9e9 parameters a rank, 2 bytes each, and 12 of AdamW state.
  const std::string sim = expect_oom("simulate --model gpt3-175b --cluster h200 --gpus 8 --tp 8",
                                     "rank 0 (pipeline stage 0", "the device", "optimizer state");
  CHECK(bytes_after(sim, "optimizer state") == Approx(6 * bytes_after(sim, "parameters")).epsilon(0.002));
  CHECK(bytes_after(sim, "parameters") == Approx(175e9 / 8 * 2).epsilon(0.01));
  // The default plan's own check, before simulating: the same four things.
  expect_oom("simulate --model llama3-70b --gpus 8", "rank 0 (pipeline stage 0", "the A100-SXM4-80GB",
             "optimizer state");
  // The planner's closest plan: ZeRO 3 with the parameters offloaded leaves the fp32 gradient working set.
  const std::string plan = run_meshtrain("plan --model gpt3-175b --gpus 8 --no-progress").out;
  INFO(plan);
  CHECK_THAT(plan, Catch::Contains("Closest: ") && Catch::Contains(": out of memory: rank ") &&
                       Catch::Contains("against the device's capacity of 80.00 GiB; its largest consumer is the "));
}

TEST_CASE("cpu training out of memory names the rank, its peak, the machine's capacity and the consumer",
          "[reliability][messages]") {
  // 4 layers of width 2^20 in fp32: 12·2^40 parameters a layer; AdamW's two moments are twice the parameters.
  const std::string wide =
      write_text("oom-wide.json", R"({"layers": 4, "hidden": 1048576, "heads": 4, "vocab": 256, "seq_len": 64})");
  const std::string t = "train --data " + training_text() + " --model " + wide + " --seq-len 16 --steps 1 --grad-bucket-mb 1048576";
  const std::string one = expect_oom(t, "rank 0 (pipeline stage 0", "this machine", "optimizer state");
  CHECK(bytes_after(one, "optimizer state") == Approx(2 * bytes_after(one, "parameters")).epsilon(0.002));
  CHECK(bytes_after(one, "parameters") >= 4 * 12.0 * 1048576.0 * 1048576.0 * 4);
  // Two rank threads share the machine: the message gives their sum too.
  const std::string two = expect_oom(t + " --dp 2", "rank 0 (pipeline stage 0", "this machine", "optimizer state");
  CHECK_THAT(two, Catch::Contains("and the 2 ranks of this process "));
  // Stage 1 holds three of the four layers: its first rank (rank 1) is the one named.
  const std::string plan = write_text("oom-pp.json", R"({"pp": 2, "first_stage_layers": 1})");
  expect_oom(t + " --plan " + plan, "rank 1 (pipeline stage 1", "this machine", "optimizer state");
}

TEST_CASE("the NaN stop says truthfully what the parameters are under --overlap-update", "[reliability][messages]") {
  const std::string t = tiny_train() + " --steps 2 --dp 2 --zero 1 --overlap-update --lr 1e30";
  expect_refusal(t + " --grad-clip 0", "the parameters already hold this step's update and are no longer those of step");
  // With clipping every update waits for the host's check: they are still the step before's.
  expect_refusal(t + " --grad-clip 1", "stopping before the update, so the parameters are those of step");
}
