#include "engine/training/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/input_file.h"

namespace meshtrain {

Result<MetricsWriter> MetricsWriter::open(const std::string& path) {
  // Appended to, so not write_output_file; but a FIFO must be refused, not block the open.
  MT_TRY(probe_output_file(path, "--metrics file"));
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) {
    return make_error(
        "cannot open metrics file '{}' for appending: {}; check that its directory exists and is "
        "writable, or pass another --metrics path",
        path, std::strerror(errno));
  }
  return MetricsWriter(path, f);
}

Status MetricsWriter::write(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"step_time_s", m.step_time_s},
                      {"tokens_per_s", m.tokens_per_s}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.val_accuracy) j["val_accuracy"] = *m.val_accuracy;
  if (m.moe) {
    j["aux_loss"] = m.moe->aux_loss;
    j["z_loss"] = m.moe->z_loss;
    j["moe_balance"] = m.moe->balance;
    j["expert_load_max_mean"] = m.moe->load_max_over_mean;
    j["expert_load_mean_max_mean"] = m.moe->load_mean_max_over_mean;
    j["dropped_fraction"] = m.moe->dropped_fraction;
    j["tokens_per_expert"] = m.moe->tokens_per_expert;
  }
  if (m.ranks) {
    j["slowest_rank"] = m.ranks->slowest_rank;
    j["slowest_compute_s"] = m.ranks->slowest_compute_s;
    j["median_compute_s"] = m.ranks->median_compute_s;
    j["straggler_lag_s"] = m.ranks->lag_s;
    j["rank_compute_s"] = m.ranks->compute_s;
    j["rank_comm_s"] = m.ranks->comm_s;
  }
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() ||
      std::fflush(file_.get()) != 0) {
    return make_error("cannot write to metrics file '{}': {}", path_, std::strerror(errno));
  }
  return ok_status();
}

std::string format_straggler(const RankTimes& r) {
  const double ratio = r.median_compute_s > 0 ? r.slowest_compute_s / r.median_compute_s : 1.0;
  return fmt::format(" | slowest rank {} +{:.3f} s compute ({:.2f}x its peers' median)", r.slowest_rank, r.lag_s,
                     ratio);
}

std::string format_hms(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds));
  return fmt::format("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string format_progress(std::int64_t step, std::int64_t total, double loss, double tokens_per_s,
                            double elapsed_s, const char* unit) {
  const std::string eta =
      step > 0 ? format_hms(elapsed_s / step * static_cast<double>(total - step)) : "--:--:--";
  return fmt::format("step {}/{} | loss {:.4f} | {:.0f} {}/s | elapsed {} | eta {}", step, total, loss,
                     tokens_per_s, unit, format_hms(elapsed_s), eta);
}

}  // namespace meshtrain
