// A backend's allocation failure in training (backends/allocation_failure.h)
// reaches the user with the memory model's estimate for the failing rank:
// its peak, its largest consumer, and the machine it ran out of (issue 29).
#include <catch2/catch.hpp>

#include "backends/allocation_failure.h"
#include "backends/cpu/cpu_backend.h"
#include "core/host_memory.h"
#include "engine/memory/memory_model.h"
#include "engine/memory/out_of_memory.h"
#include "engine/training/train_guard.h"
#include "models/model_spec.h"

using namespace meshtrain;

namespace {

// The cpu backend's own error for an allocation no machine can make.
Status failed_allocation() {
  CpuBackend b;
  Tensor huge = b.empty(Shape{std::int64_t{1} << 42});
  b.fill(huge, 0.f);
  return b.synchronize();
}

}  // namespace

TEST_CASE("an allocation failure in training names the rank's estimated peak and largest consumer",
          "[train][reliability][memory]") {
  const Status failed = failed_allocation();
  REQUIRE_FALSE(failed.ok());
  REQUIRE(is_allocation_failure(failed.error()));
  const ModelSpec m = *model_preset("tiny");
  Plan p;
  p.pp = 2;
  TrainOptions o;  // no data file, no checkpoint: the model state alone
  Status with_context = failed;
  with_context.context("step 3");
  const Status explained = explain_allocation_failure(with_context, o, m, p, 1, 2);
  REQUIRE_FALSE(explained.ok());
  const std::string& msg = explained.error().message();
  // The backend's own words stay first, with their context.
  CHECK_THAT(msg, Catch::StartsWith("step 3: cpu rank 0: empty: out of host memory: cannot allocate 17592186044416 bytes"));
  // Rank 1 is pipeline stage 1: the memory model's figures for that stage.
  const MemoryBreakdown stage1 = memory_per_rank(m, p, 1, meshtrain_layout(p));
  const MemoryConsumer top = largest_consumer(memory_consumers(stage1));
  CHECK_THAT(msg, Catch::Contains(fmt::format("rank 1 ran out of memory; the memory model estimates its "
                                              "peak at {}, of which the largest consumer is the {} ({})",
                                              human_bytes(stage1.total()), top.name, human_bytes(top.bytes))));
  // Two rank threads share the machine: its capacity and their sum.
  const MemoryBreakdown stage0 = memory_per_rank(m, p, 0, meshtrain_layout(p));
  CHECK_THAT(msg, Catch::Contains(fmt::format("against this machine's {} for the 2 ranks of this process, which "
                                              "need {} together",
                                              human_bytes(host_memory_bytes()),
                                              human_bytes(stage0.total() + stage1.total()))));
  CHECK_THAT(msg, Catch::Contains("--recompute full"));
}

TEST_CASE("other errors pass through unexplained", "[train][reliability][memory]") {
  const ModelSpec m = *model_preset("tiny");
  const Plan p;
  const Status other = make_error("rank 0: collective timed out");
  const Status same = explain_allocation_failure(other, TrainOptions{}, m, p, 0, 1);
  REQUIRE_FALSE(same.ok());
  CHECK(same.error().message() == "rank 0: collective timed out");
  CHECK(explain_allocation_failure(ok_status(), TrainOptions{}, m, p, 0, 1).ok());
  // The phrase is the backends' one, whatever they append (cuda's caching allocator too).
  CHECK(is_allocation_failure(Error(allocation_failure_message("device", 8, "a segment of 2097152") + " (0 live)")));
  CHECK_FALSE(is_allocation_failure(Error("out of memory: rank 0 peaks at an estimated 2 GiB")));
}
