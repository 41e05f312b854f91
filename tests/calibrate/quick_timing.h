// Timing for the calibration tests' measurements: few short samples, and
// buffer sets capped at 64 KiB (calibrate --quick's idea, smaller).
#pragma once

#include "engine/calibrate/measure.h"

namespace meshtrain::testing {

inline calibrate::Timing quick_timing(int samples, double min_sample_s) {
  calibrate::Timing t;
  t.samples = samples;
  t.min_sample_s = min_sample_s;
  t.max_cold_bytes = 1 << 16;
  return t;
}

}  // namespace meshtrain::testing
