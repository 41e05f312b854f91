// BackendWrapper forwards what it does not override.
#include "backends/backend_wrapper.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

// Counts GEMMs and forwards everything.
class CountingBackend final : public BackendWrapper {
 public:
  using BackendWrapper::BackendWrapper;
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    ++gemms;
    BackendWrapper::gemm(a, b, c, op);
  }
  int gemms = 0;
};

TEST_CASE("BackendWrapper forwards to its target and lets one method be overridden", "[cpu]") {
  CpuBackend cpu;
  CountingBackend b(cpu);
  CHECK(b.name() == "cpu");
  CHECK(&b.target() == &cpu);
  Tensor a = testing::upload(b, {2, 2}, {1, 2, 3, 4});
  Tensor c = b.empty({2, 2});
  b.gemm(a, a, c, GemmOp{});
  b.scale(c, 0.5f);
  CHECK(testing::download(b, c) == testing::Vec{3.5, 5, 7.5, 11});
  CHECK(b.gemms == 1);
  CHECK(b.memory_stats().live_bytes == cpu.memory_stats().live_bytes);
  CHECK(b.memory_stats().live_bytes == 32);
  CHECK(b.synchronize().ok());
}

}  // namespace
}  // namespace meshtrain
