// Issue 29, class 5: messages name the real cause. Before: `--straggler -1:2`
// said "got ''", a four-field workload complained about its micro-batch "2:16",
// a segment of no modules said it started at block 9, an A100 calibration with
// backend cpu on dgx-a100 reported a device mismatch between identical
// devices, and a non-finite step under --overlap-update claimed the
// parameters were those of the step before.
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

TEST_CASE("out of memory names the rank, its peak against capacity and the largest consumer", "[reliability][messages]") {
  expect_refusal("simulate --model gpt3-175b --cluster h200 --gpus 8 --tp 8",
                 "out of memory: rank 0 (pipeline stage 0");
  expect_refusal("simulate --model gpt3-175b --cluster h200 --gpus 8 --tp 8", "against the device's capacity of");
  expect_refusal("simulate --model gpt3-175b --cluster h200 --gpus 8 --tp 8", "its largest consumer is the optimizer state");
}

TEST_CASE("the NaN stop says truthfully what the parameters are under --overlap-update", "[reliability][messages]") {
  const std::string t = tiny_train() + " --steps 2 --dp 2 --zero 1 --overlap-update --lr 1e30";
  expect_refusal(t + " --grad-clip 0", "the parameters already hold this step's update and are no longer those of step");
  // With clipping every update waits for the host's check: they are still the step before's.
  expect_refusal(t + " --grad-clip 1", "stopping before the update, so the parameters are those of step");
}
