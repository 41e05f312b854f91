// An allocation the cpu backend cannot make is its sticky error (returned by
// the next blocking call, every op in between a no-op), not an abort.
#include <catch2/catch.hpp>

#include <vector>

#include "backends/cpu/cpu_backend.h"

using namespace meshtrain;

TEST_CASE("a failed cpu-backend allocation is an error value", "[reliability][sizes]") {
  CpuBackend b;
  Tensor small = b.empty(Shape{4});
  b.fill(small, 1.f);
  // 2^42 floats: 16 TiB, more than any machine this runs on.
  Tensor huge = b.empty(Shape{std::int64_t{1} << 42});
  b.fill(huge, 0.f);  // a no-op now, not a write through a null pointer
  b.add(small, small, small);
  const Status s = b.synchronize();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("out of host memory: cannot allocate 17592186044416 bytes") &&
                                      Catch::Contains("(4398046511104)"));
  std::vector<float> host(4);
  CHECK_FALSE(b.read(small, host).ok());
}
