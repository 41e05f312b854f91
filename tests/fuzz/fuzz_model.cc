// Fuzz target: the model file reader (models/model_spec.h), then what every
// command computes from an accepted model (parameters, FLOPs).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/json_input.h"
#include "models/flops.h"
#include "models/model_spec.h"
#include "models/parameters.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain;
  auto j = parse_json(meshtrain::fuzz::fuzz_text(data, size), "fuzz model");
  if (!j.ok()) return 0;
  auto m = model_from_json(*j);
  if (!m.ok()) return 0;
  (void)model_to_json(*m).dump();
  (void)count_parameters(*m);
  (void)training_flops(*m, 8, m->seq_len, Recompute::selective);
  return 0;
}
