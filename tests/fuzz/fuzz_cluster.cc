// Fuzz target: the cluster file reader (simulator/cluster_spec.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "simulator/cluster_spec.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto spec = meshtrain::sim::cluster_spec_from_json(meshtrain::fuzz::fuzz_text(data, size));
  if (spec.ok()) (void)meshtrain::sim::validate(*spec);
  return 0;
}
