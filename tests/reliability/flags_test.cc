// Bad flags of every command are refused before anything runs, naming the
// flag and its range: no crash (--tp 0 was a SIGFPE), nothing silently
// ignored (--gpus 0 ran on one GPU, --seed -1 became 2^64-1).
#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

TEST_CASE("plan degrees of 0 are refused by every command, from flags and from files", "[reliability][flags]") {
  for (const char* flag : {"--tp", "--pp", "--cp", "--dp", "--vpp", "--micro-batch"}) {
    expect_refusal(std::string("simulate --model tiny --gpus 8 ") + flag + " 0", std::string(flag) + ": must be an integer in [1, ");
    expect_refusal(std::string("info --model tiny ") + flag + " 0", std::string(flag) + ": must be an integer in [1, ");
  }
  const std::string plan = write_text("tp0.json", R"({"tp": 0})");
  expect_refusal("simulate --model tiny --gpus 8 --plan " + plan, "plan field 'tp' must be an integer in [1, 1048576], got 0");
  expect_refusal("simulate --model tiny --gpus 0", "--gpus: must be an integer in [1, 1048576], got 0");
  expect_refusal("simulate --model tiny --gpus 3 --tp 2", "--gpus 3 is not a multiple of tp·pp·cp = 2");
}

TEST_CASE("training numbers: finite, in range, and meaningful", "[reliability][flags]") {
  const std::string t = tiny_train() + " --steps 2";
  expect_refusal(t + " --lr inf", "--lr: must be a finite number > 0, got inf");
  expect_refusal(t + " --lr nan", "--lr: must be a finite number > 0");
  expect_refusal(t + " --lr 0", "--lr: must be a finite number > 0");
  expect_refusal(t + " --dropout 1.5", "--dropout: must be a finite number in [0, 1), got 1.5");
  expect_refusal(t + " --dropout -0.5", "--dropout: is negative (-0.5); it must be a finite number in [0, 1)");
  expect_refusal(t + " --dropout nan", "--dropout: must be a finite number in [0, 1)");
  expect_refusal(t + " --seed -1", "--seed: is negative (-1); it must be an integer in [0, 18446744073709551615]");
  expect_refusal(t + " --seed 1e23", "--seed: must be an integer");
  expect_refusal(t + " --grad-clip nan", "--grad-clip: must be a finite number");
  expect_refusal(t + " --comm-timeout nan", "--comm-timeout: must be a finite number in [0.001, 604800]");
  expect_refusal(t + " --comm-timeout -1", "--comm-timeout: is negative (-1); it must be a finite number");
  expect_refusal(t + " --comm-timeout 0", "--comm-timeout: must be a finite number");
  expect_refusal(t + " --steps 0", "--steps: must be an integer in [1, ");
  expect_refusal(t + " --micro-batch 1e8", "--micro-batch: must be an integer in [1, 1048576], got '1e8'");
  // 2^31 - 1 threads per rank was a SIGSEGV.
  expect_refusal(t + " --threads 2147483647", "--threads: must be an integer in [0, 65536], got 2147483647");
  expect_refusal(t + " --threads -5", "--threads: is negative (-5); it must be an integer in [0, 65536]");
}

TEST_CASE("flags that would do nothing are refused, saying what they need", "[reliability][flags]") {
  const std::string t = tiny_train() + " --steps 2";
  expect_refusal(t + " --stop-at 1", "--stop-at 1 stops the run as a preemption would, but without --checkpoint");
  expect_refusal(t + " --checkpoint-every 1", "--checkpoint-every 1 needs --checkpoint DIR");
  expect_refusal(t + " --overwrite-checkpoint", "--overwrite-checkpoint needs --checkpoint DIR");
  const std::string dir = scratch("both").string();
  expect_refusal(t + " --checkpoint " + dir + " --resume --overwrite-checkpoint", "give one of them");
  expect_refusal("simulate --model tiny --gpus 2 --comm mpi", "--comm mpi chooses which measured collectives of --calibration apply");
}

TEST_CASE("the default warm-up fits short runs, an explicit one must fit", "[reliability][flags]") {
  const MeshtrainRun three = run_meshtrain(tiny_train() + " --steps 3");
  INFO(three.out);
  CHECK(three.status == 0);
  expect_refusal(tiny_train() + " --steps 3 --warmup 10", "warm-up of 10 steps must be between 0 and the 3 total steps");
}

TEST_CASE("calibrate checks --out and its workloads before measuring", "[reliability][flags]") {
  expect_refusal("calibrate --quick --out /nonexistent-dir/cal.json",
                 "cannot write --out calibration file '/nonexistent-dir/cal.json': No such file or directory");
  const std::string out = scratch("cal.json").string();
  expect_refusal("calibrate --quick --no-grid --workload tiny:0:64 --out " + out, "the micro-batch must be an integer in [1, 1048576], got 0");
  expect_refusal("calibrate --quick --no-grid --workload tiny:2:65 --out " + out, "the sequence length (at most the model's) must be an integer in [1, 64]");
  expect_refusal("calibrate --quick --no-grid --workload tiny:1e3:64 --out " + out, "got '1e3'");
}

TEST_CASE("goodput's rates keep every figure finite", "[reliability][flags]") {
  // 1e-300 GB/s made a checkpoint take 1e300 s and printed a hundred-digit percentage.
  const std::string g = "goodput --model tiny --cluster h200 --gpus 8 --iteration-s 1 --mtbf-hours 1000";
  expect_refusal(g + " --storage-GBps 1e-300", "--storage-GBps: must be a finite number in [0.001, 1000000000], got 1e-300");
  expect_refusal(g + " --storage-GBps nan", "--storage-GBps: must be a finite number");
  CHECK(run_meshtrain(g + " --storage-GBps 0.001").status == 0);
}
