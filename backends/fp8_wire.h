// The bytes an FP8 gather moves (Backend::all_gather_fp8): Transformer Engine
// sends FP8 values at one byte an element, and a parameter bucket that mixes
// FP8 weights with others (Plan::fp8_param_gather) sends the others at their
// own dtype's size. One count for every backend that times or traces the wire.
#pragma once

#include <cstdint>

#include "backends/backend.h"

namespace meshtrain {

// `elements` of dtype `wide`, of which `fp8_elements` travel as FP8.
inline double fp8_gather_bytes(std::int64_t elements, std::int64_t fp8_elements, DType wide) {
  return static_cast<double>(fp8_elements) +
         static_cast<double>(elements - fp8_elements) * static_cast<double>(dtype_size(wide));
}

}  // namespace meshtrain
