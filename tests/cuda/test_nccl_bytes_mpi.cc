// Under `mpirun -np 2`, one GPU per rank: the bytes each rank's NCCL
// communicator sends per training step (CudaBackend::bytes_sent) drop by the
// gradient compression's factor, as the cpu communicators count them
// (tests/parallel/test_grad_compression.cc): the same tiny plans, data
// parallel over the ranks, the same check (compressed_bytes.h). NCCL refuses
// two ranks on one device, so with fewer devices than ranks every rank prints
// "SKIPPED" (ctest: Skipped).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdio>

#include "backends/cuda/cuda_backend.h"
#include "tests/mpi_catch_main.h"
#include "tests/parallel/compressed_bytes.h"
#include "tests/parallel/parallel_harness.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// Bytes this rank sends during each of kSteps steps of `p` (dp ranks over MPI, one GPU each).
std::vector<std::int64_t> bytes_per_step(const ModelSpec& m, const Plan& p) {
  REQUIRE(validate_plan(p, m).ok());
  cuda::CudaOptions options;
  options.use_mpi = true;
  auto created = cuda::CudaBackend::create(options);
  INFO((created.ok() ? std::string() : created.error().message()));
  REQUIRE(created.ok());
  cuda::CudaBackend& b = **created;
  REQUIRE(b.world_size() == p.world_size());
  const Mesh mesh(p);
  TrainingEngine engine(b, m, p, step_options());
  const int d = mesh.coord_of(b.rank()).dp, per = p.microbatches();
  std::vector<std::int64_t> out;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<HostBatch> all = global_batch(m, step);
    const std::int64_t before = b.bytes_sent();
    auto r = engine.step({all.begin() + d * per, all.begin() + (d + 1) * per}, 1e-2f, step);
    INFO((r.ok() ? std::string() : r.error().message()));
    REQUIRE(r.ok());
    out.push_back(b.bytes_sent() - before);
  }
  return out;
}

int world_size() {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

}  // namespace

TEST_CASE("on NCCL, compressed gradients send the expected fraction of the fp32 bytes per step",
          "[cuda][gpu][mpi][compression][bytes]") {
  if (cuda::device_count() < world_size()) {
    WARN("SKIPPED: " << cuda::device_count() << " CUDA device(s) for " << world_size()
                     << " ranks (NCCL needs one per rank); nothing checked");
    std::puts("SKIPPED: fewer CUDA devices than ranks");
    return;
  }
  for (int zero : {0, 1}) {
    Plan p = make_plan(1, 1, world_size(), zero, ScheduleKind::one_f_one_b);
    p.grad_bucket_mb = 4;  // one bucket per stage
    INFO("seed " << kSeed << ", zero " << zero);
    check_compressed_bytes(p, [](const Plan& q) { return bytes_per_step(tiny_gpt(), q); });
  }
}

int main(int argc, char** argv) { return meshtrain::testing::run_catch_under_mpi(argc, argv); }
