#include "engine/training/run_summary.h"

#include <fmt/format.h>

#include "engine/training/metrics.h"

namespace meshtrain {

std::string format_run_summary(const RunSummary& s) {
  const std::int64_t steps = s.last_step - s.first_step + 1;
  const double rate = s.step_seconds > 0 ? s.tokens / s.step_seconds : 0;
  std::string out = fmt::format("run summary\n  steps        {} ({}..{} of {})\n", steps, s.first_step, s.last_step,
                                s.total_steps);
  out += fmt::format("  throughput   {:.0f} {}/s ({:.0f} {} in {:.2f} s of steps)\n", rate, s.unit, s.tokens, s.unit,
                     s.step_seconds);
  const double achieved = rate * s.flops_per_token;
  if (s.peak_flops > 0)
    out += fmt::format("  MFU          {:.1f}% ({:.3g} model TFLOP/s of {:.3g} peak, from {})\n",
                       100 * achieved / s.peak_flops, achieved / 1e12, s.peak_flops / 1e12, s.peak_source);
  else
    out += fmt::format("  MFU          unknown: no peak FLOP/s for this device ({:.3g} model TFLOP/s; give "
                       "--peak-tflops)\n", achieved / 1e12);
  out += fmt::format("  final loss   {:.4f}", s.final_loss);
  if (s.final_val_loss) out += fmt::format(" (validation {:.4f})", *s.final_val_loss);
  if (s.final_val_accuracy) out += fmt::format(" (validation accuracy {:.2f}%)", 100 * *s.final_val_accuracy);
  out += fmt::format("\n  wall time    {}\n", format_hms(s.wall_seconds));
  out += s.checkpoint.empty() ? std::string("  checkpoint   none (no --checkpoint)\n")
                              : fmt::format("  checkpoint   {} (step {})\n", s.checkpoint, s.checkpoint_step);
  out += s.metrics.empty() ? std::string("  metrics      none (no --metrics)\n")
                           : fmt::format("  metrics      {}\n", s.metrics);
  return out;
}

}  // namespace meshtrain
