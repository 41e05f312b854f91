#include "engine/calibrate/workload.h"

#include "core/bounded.h"

namespace meshtrain::calibrate {

Result<Workload> parse_workload(const std::string& text, std::string_view flag) {
  const auto a = text.find(':'), b = text.rfind(':');
  if (a == std::string::npos || a == b)
    return make_error("{} '{}' must be MODEL:MICRO_BATCH:SEQ_LEN, e.g. tiny:8:64", flag, text);
  Workload w;
  MT_ASSIGN(w.model, load_model(text.substr(0, a)));
  const std::string where = fmt::format("{} '{}':", flag, text);
  MT_ASSIGN(w.batch, parse_int(where + " the micro-batch", text.substr(a + 1, b - a - 1), IntRange{1, 1 << 20}));
  MT_ASSIGN(w.seq, parse_int(where + " the sequence length (at most the model's)", text.substr(b + 1),
                             IntRange{1, w.model.seq_len}));
  return w;
}

}  // namespace meshtrain::calibrate
