// The one interpolation rule of calibration lookups (calibration.h): a
// measured throughput (work per second) is piecewise linear in log(work)
// between the two measured neighbours of a query and constant beyond the
// ends; the query's time is its work over that throughput.
#pragma once

#include <optional>
#include <vector>

namespace meshtrain::sim {

struct ThroughputPoint {
  double work;        // FLOPs or bytes
  double throughput;  // work per second
};

// Seconds for `work` from `points` (any order); nullopt when there are none or work <= 0.
std::optional<double> interpolate_time(std::vector<ThroughputPoint> points, double work);

}  // namespace meshtrain::sim
