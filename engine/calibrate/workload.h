// A workload, MODEL:MICRO_BATCH:SEQ_LEN ("tiny:8:64"), or MODEL:MICRO_BATCH
// for a vision model whose images fix the tokens ("swin-fmnist:16"), as
// `calibrate --workload` and `calibrate --profile` take it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "models/model_spec.h"

namespace meshtrain::calibrate {

struct Workload {
  ModelSpec model;
  std::int64_t batch = 0, seq = 0;
};

// The model (preset or file), a micro-batch in [1, 2^20] and a sequence
// length in [1, the model's]; `flag` names the flag in errors.
Result<Workload> parse_workload(const std::string& text, std::string_view flag);

}  // namespace meshtrain::calibrate
