// Sizes that cannot fit are refused with the figure before anything is
// allocated (they ran away to 12-17 GB or aborted with bad_alloc before).
// Mixture-of-experts models, refused by name until the engine had expert
// layers, now train and simulate (tests/train/train_moe_test.cc).
#include "core/host_memory.h"
#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

TEST_CASE("sizes beyond any real job are refused by range", "[reliability][sizes]") {
  expect_refusal("simulate --model tiny --gpus 100000000", "--gpus: must be an integer in [1, 1048576], got 100000000");
  expect_refusal("simulate --model tiny --gpus 1 --micro-batches 100000000", "--micro-batches: must be an integer in [1, 1048576]");
  expect_refusal("simulate --model tiny --gpus 1 --micro-batch 1048576 --micro-batches 1048576",
                 "micro_batch·dp·microbatches = 1048576·1·1048576 = 1099511627776 sequences per iteration; the most is 1073741824");
  expect_refusal("info --model " + write_text("deep-model.json", R"({"layers": 1000000000, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64})"),
                 "model field 'layers' must be an integer in [1, 65536], got 1000000000");
  expect_refusal("calibrate --quick --no-grid --workload tiny:100000000:64 --out " + scratch("c.json").string(),
                 "the micro-batch must be an integer in [1, 1048576], got 100000000");
}

TEST_CASE("sizes within range but beyond this machine are refused with the estimate", "[reliability][sizes]") {
  // A tiny gradient bucket: one collective per few gradients, millions of them.
  expect_refusal("simulate --model gpt2-124m --gpus 1 --grad-bucket-mb 1e-9",
                 "grad_bucket_mb (--grad-bucket-mb) 1e-09 cuts about 1.24e+08 gradients per rank into");
  // A cpu-backend model of 2^20 width: terabytes of parameters.
  const std::string wide =
      write_text("wide.json", R"({"layers": 4, "hidden": 1048576, "heads": 4, "vocab": 256, "seq_len": 64})");
  expect_refusal("train --data " + training_text() + " --model " + wide + " --seq-len 16 --steps 1 --grad-bucket-mb 1048576",
                 "training model 'custom' on the cpu backend with 1 rank in this process");
  expect_refusal("simulate --model tiny --gpus 1 --micro-batch 1048576 --micro-batches 1024",
                 "simulating 1 GPUs running 1024 micro-batches of 1048576 x 64 tokens");
  expect_refusal("calibrate --quick --no-grid --workload gpt2-124m:1048576:1024 --out " + scratch("c.json").string(),
                 "measuring the largest --workload shape needs about");
}


TEST_CASE("a data file larger than this machine's memory is refused before it is read", "[reliability][sizes]") {
  // A sparse file twice the memory: it was read byte by byte until the machine ran out.
  const fs::path big = scratch("sparse-data.bin");
  { std::ofstream(big).put('x'); }
  fs::resize_file(big, static_cast<std::uintmax_t>(2 * meshtrain::host_memory_bytes()));
  expect_refusal("train --model tiny --seq-len 16 --steps 1 --data " + big.string(),
                 "reading data file '" + big.string() + "' into memory needs about");
  fs::remove(big);
}
