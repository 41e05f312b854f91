// Calibration's list of per-op measurements is the op table's: every op of a
// class calibration measures one by one is on it, each measurement runs the
// op's sample on the cpu backend, and the bytes it records are the bytes the
// simulator charges for the same call.
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/op_table.h"
#include "engine/calibrate/measure.h"
#include "tests/calibrate/quick_timing.h"

using namespace meshtrain;

TEST_CASE("calibration measures every memory-bound and host op of the table", "[calibrate][op_table]") {
  const std::vector<std::string>& measured = calibrate::measured_ops();
  const std::set<std::string> names(measured.begin(), measured.end());
  CHECK(names.size() == measured.size());  // each cost name once
  std::size_t covered = 0;
  for (const OpInfo& op : op_table()) {
    INFO(op.name);
    const bool listed = names.count(std::string(op.cost_name)) > 0;
    if (op.cls == CostClass::memory || op.cls == CostClass::host) {
      CHECK(listed);
      ++covered;
    }
    // gemm and attention are measured by shape, communication by group size: not per op.
    if (op.cls == CostClass::gemm || op.cls == CostClass::attention || op.cls == CostClass::p2p) CHECK(!listed);
  }
  CHECK(covered >= 40);  // the table's memory-bound and host ops, today 43
  // Ops the hand-kept list of old left to the by-bytes memory table.
  for (const char* op : {"rmsnorm_forward", "swiglu_backward", "dropout_forward", "moe_combine_backward", "rope",
                         "attention_merge", "host_adamw", "sign_decompress"})
    CHECK(names.count(op) == 1);
}

TEST_CASE("each measurement runs its op and records the bytes the simulator counts", "[calibrate][op_table]") {
  CpuBackend b(CpuBackendOptions{1});
  const calibrate::Timing quick = testing::quick_timing(1, 1e-6);
  std::vector<calibrate::OpShape> shapes;
  for (const std::string& op : calibrate::measured_ops()) shapes.push_back({op, 4, 8, DType::f32});
  auto entries = calibrate::measure_ops(b, shapes, quick, {}, 1, {});
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == shapes.size());
  for (const sim::Calibration::Op& e : *entries) {
    INFO(e.op);
    CHECK(e.time_us > 0);
    // By hand for a few: (4, 8) fp32 tensors of 128 bytes, rows of 16 and a 4-byte scalar.
    if (e.op == "add") CHECK(e.bytes == 3 * 128.0);
    if (e.op == "scale") CHECK(e.bytes == 2 * 128.0);
    if (e.op == "layernorm_forward") CHECK(e.bytes == 128 + 32 + 32 + 128 + 16 + 16);
    if (e.op == "adamw") CHECK(e.bytes == 7 * 128.0 + 4);             // param, m, v read and written, grad read, coef
    if (e.op == "swiglu_forward") CHECK(e.bytes == 2 * 128.0 + 128);  // x (4, 16) in, out (4, 8)
  }
  auto unknown = calibrate::measure_ops(b, {{"no_such_op", 4, 8, DType::f32}}, quick, {}, 1, {});
  REQUIRE(!unknown.ok());
  CHECK_THAT(unknown.error().message(), Catch::Contains("no measurement for op 'no_such_op'"));
}
