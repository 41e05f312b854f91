#include "engine/calibrate/workload.h"

#include <algorithm>

#include "core/bounded.h"
#include "models/model_io.h"

namespace meshtrain::calibrate {

Result<Workload> parse_workload(const std::string& text, std::string_view flag) {
  const auto a = text.find(':'), b = text.rfind(':');
  if (a == std::string::npos)
    return make_error("{} '{}' must be MODEL:MICRO_BATCH:SEQ_LEN (MODEL:MICRO_BATCH for a vision model), e.g. "
                      "tiny:8:64 or swin-fmnist:16", flag, text);
  const auto fields = 1 + std::count(text.begin(), text.end(), ':');
  if (fields > 3)
    return make_error("{} '{}' has {} fields; it takes at most 3: MODEL:MICRO_BATCH:SEQ_LEN (MODEL:MICRO_BATCH for a "
                      "vision model), e.g. tiny:8:64", flag, text, fields);
  Workload w;
  MT_ASSIGN(w.model, load_model(text.substr(0, a)));
  const bool with_seq = a != b;
  const bool fixed = model_io(w.model).tokens_fixed_by_model;
  if (with_seq == fixed)
    return make_error("{} '{}': give {} for model '{}'", flag, text,
                      fixed ? "MODEL:MICRO_BATCH (its images fix the tokens)" : "MODEL:MICRO_BATCH:SEQ_LEN",
                      w.model.name);
  const std::string where = fmt::format("{} '{}':", flag, text);
  MT_ASSIGN(w.batch, parse_int(where + " the micro-batch", text.substr(a + 1, with_seq ? b - a - 1 : std::string::npos),
                               IntRange{1, 1 << 20}));
  if (!with_seq) {
    w.seq = w.model.seq_len;
    return w;
  }
  MT_ASSIGN(w.seq, parse_int(where + " the sequence length (at most the model's)", text.substr(b + 1),
                             IntRange{1, w.model.seq_len}));
  return w;
}

}  // namespace meshtrain::calibrate
