// `meshtrain train --backend`: cuda where this build has it and a device is
// visible, otherwise a clear error and exit status 1; an unknown name
// suggests the nearest.
#include <catch2/catch.hpp>

#include <string>

#include "backends/cuda/cuda_factory.h"
#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

using meshtrain::testing::training_text;

namespace {

const std::string kRun = " --model tiny --seq-len 32 --micro-batch 2 --steps 2 --warmup 0";

}  // namespace

TEST_CASE("train with backend cuda fails cleanly without a CUDA build or a device", "[backend]") {
  // Asked directly first, and released before the command runs on the same device.
  std::string direct_error;
  {
    auto direct = meshtrain::make_cuda_backend({});
    if (!direct.ok()) direct_error = direct.error().message();
  }
  MeshtrainRun r = run_meshtrain("train --data " + training_text() + kRun + " --backend cuda");
  INFO(r.out);
  if (!meshtrain::cuda_backend_built()) {
    CHECK_THAT(direct_error, Catch::StartsWith("this meshtrain was built without CUDA"));
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("meshtrain train: error: this meshtrain was built without CUDA"));
  } else if (!direct_error.empty()) {
    WARN("cuda backend built; no device: " << direct_error);
    CHECK_THAT(direct_error, Catch::StartsWith("no CUDA device found"));
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("meshtrain train: error: no CUDA device found"));
  } else {
    // A GPU is here: the same command trains on it (bf16, the plan's default).
    WARN("cuda backend built and a device found: training on it");
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("step 2/2"));
  }
}

TEST_CASE("train with backend cuda and several ranks needs one process per rank", "[backend]") {
  MeshtrainRun r = run_meshtrain("train --data " + training_text() + kRun + " --backend cuda --tp 2");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("the cuda backend runs one rank per process") &&
                        Catch::Contains("mpirun -np 2"));
}

TEST_CASE("an unknown backend suggests the nearest", "[backend]") {
  MeshtrainRun cudaa = run_meshtrain("train --data " + training_text() + kRun + " --backend cudaa");
  CHECK(cudaa.status == 1);
  CHECK_THAT(cudaa.out, Catch::Contains("unknown --backend 'cudaa' (did you mean 'cuda'?"));
  MeshtrainRun gpu = run_meshtrain("train --data " + training_text() + kRun + " --backend gpu");
  CHECK(gpu.status == 1);
  CHECK_THAT(gpu.out, Catch::Contains("(did you mean 'cpu'? valid: cpu, cuda)"));
}

TEST_CASE("the cpu backend still refuses bf16, cuda refuses fp16", "[backend]") {
  MeshtrainRun cpu = run_meshtrain("train --data " + training_text() + kRun + " --precision bf16");
  CHECK(cpu.status == 1);
  CHECK_THAT(cpu.out, Catch::Contains("the cpu backend trains in fp32"));
  MeshtrainRun cuda =
      run_meshtrain("train --data " + training_text() + kRun + " --backend cuda --precision fp16");
  CHECK(cuda.status == 1);
  CHECK_THAT(cuda.out, Catch::Contains("--precision fp16 needs loss scaling"));
}
