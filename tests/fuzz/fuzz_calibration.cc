// Fuzz target: the calibration file reader (simulator/calibration.h), then
// the writer (an accepted calibration must round-trip) and the lookups the
// simulator makes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "simulator/calibration.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain::sim;
  auto c = calibration_from_json(meshtrain::fuzz::fuzz_text(data, size));
  if (!c.ok()) return 0;
  auto again = calibration_from_json(calibration_to_json(*c));
  if (!again.ok()) std::abort();  // what the writer writes, the reader must read
  for (int ranks : {1, 2, 8}) {
    const Calibration at = c->for_ranks_sharing(ranks).for_transport("threads");
    (void)at.gemm_time(4096, 4096, 4096, DType::kBf16);
    (void)at.attention_time(32, 2048, 128, true);
    (void)at.attention_backward_time(32, 2048, 128, true);
    (void)at.memory_time(1 << 20);
    (void)at.op_time("gelu_forward", 1 << 20);
    (void)at.collective_busbw(CollectiveKind::kAllReduce, 8, 1 << 26);
  }
  (void)calibration_coverage(*c, DType::kFp32);
  ClusterSpec spec = cluster_preset("dgx-a100").value();
  (void)check_calibration_device(*c, spec);
  apply_link_calibration(*c, spec);
  return 0;
}
