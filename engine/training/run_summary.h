// The lines a training run ends with: how far it got, how fast, how well,
// and where its checkpoint and metrics are, so that a log's last lines say
// what the run produced without scrolling back through its progress.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace meshtrain {

struct RunSummary {
  std::int64_t first_step = 1, last_step = 0, total_steps = 0;  // steps first..last of total ran
  double tokens = 0;          // tokens (images, questions) trained on in those steps
  double step_seconds = 0;    // their summed step times (tokens / step_seconds: throughput)
  double wall_seconds = 0;    // the whole run, set-up and checkpoints included
  double flops_per_token = 0; // model FLOPs (forward and backward) per token: what MFU counts
  double peak_flops = 0;      // the ranks' summed peak FLOP/s; 0: unknown (no MFU)
  std::string peak_source;    // where peak_flops came from ("--peak-tflops", "the local-cpu preset")
  const char* unit = "tokens";
  double final_loss = 0;
  std::optional<double> final_val_loss, final_val_accuracy;
  std::string checkpoint;     // the directory and step of the last checkpoint, or "" for none
  std::int64_t checkpoint_step = 0;
  std::string metrics;        // the --metrics file, or ""
};

// Several lines, each ending in a newline, beginning "run summary".
std::string format_run_summary(const RunSummary& s);

}  // namespace meshtrain
