// Training metrics: one JSON object per line (JSON Lines) for machines, and a
// one-line progress string for the terminal.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

// A mixture-of-experts model's figures of a step (engine/step/step_engine.h MoeStepStats).
struct MoeMetrics {
  double aux_loss = 0, z_loss = 0;  // the terms added to the objective
  double balance = 0;               // E·Σ f·P per layer, mean (1: balanced)
  double load_max_over_mean = 0;    // the worst MoE layer's max / mean tokens per expert
  double load_mean_max_over_mean = 0;
  double dropped_fraction = 0;
  std::vector<std::vector<double>> tokens_per_expert;  // by MoE layer
};

// Every rank's time in one step (engine/training/step_timing.h) and the slowest
// rank's lag against the median of the ranks it compares with.
struct RankTimes {
  std::vector<double> compute_s, comm_s;  // by rank
  int slowest_rank = -1;
  double slowest_compute_s = 0, median_compute_s = 0, lag_s = 0;
};

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  std::optional<double> val_loss{};      // written only when measured this step
  std::optional<double> val_accuracy{};  // top-1, vision models, with val_loss
  std::optional<MoeMetrics> moe{};       // models with experts
  std::optional<RankTimes> ranks{};      // with several ranks
};

// Appends to the file (a resumed run continues the same file) and flushes each
// line, so a crash loses at most the line being written. JSON has no NaN or
// Inf: a non-finite value is written as null.
class MetricsWriter {
 public:
  // Errors naming the file when it cannot be opened for appending.
  static Result<MetricsWriter> open(const std::string& path);

  // {"step":…,"loss":…,"lr":…,"step_time_s":…,"tokens_per_s":…[,"val_loss":…[,"val_accuracy":…]]}
  // (tokens_per_s counts images for a vision model); a model with experts
  // adds "aux_loss", "z_loss", "moe_balance", "expert_load_max_mean" (worst
  // layer), "expert_load_mean_max_mean" (mean over layers), "dropped_fraction"
  // and "tokens_per_expert" (one list per MoE layer, before drops); with
  // several ranks also "slowest_rank", "slowest_compute_s", "median_compute_s",
  // "straggler_lag_s" and by rank "rank_compute_s", "rank_comm_s".
  Status write(const StepMetrics& m);

 private:
  MetricsWriter(std::string path, std::FILE* f) : path_(std::move(path)), file_(f, &std::fclose) {}
  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
};

// "step 12/500 | loss 3.4521 | 8192 tok/s | elapsed 00:01:02 | eta 00:42:10"
// (`unit` "img" for images). The ETA assumes the remaining steps take the mean
// time of those done; it is "--:--:--" before the first step.
std::string format_progress(std::int64_t step, std::int64_t total, double loss, double tokens_per_s,
                            double elapsed_s, const char* unit = "tok");

// " | slowest rank 3 +0.412 s compute (2.10x its peers' median)".
std::string format_straggler(const RankTimes& r);

// Seconds as hh:mm:ss (hours grow past 99 rather than wrap).
std::string format_hms(double seconds);

}  // namespace meshtrain
