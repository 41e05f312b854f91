// Calibration lookups over the measured throughput curve: the interpolation
// rule every table shares (calibration_interpolate.h) and the grouped-GEMM
// lookup over rows per group (calibration.h).
#include <algorithm>
#include <cmath>

#include "simulator/calibration.h"
#include "simulator/calibration_interpolate.h"

namespace meshtrain::sim {

std::optional<double> interpolate_time(std::vector<ThroughputPoint> pts, double work) {
  if (pts.empty() || !(work > 0)) return std::nullopt;
  std::sort(pts.begin(), pts.end(), [](const ThroughputPoint& a, const ThroughputPoint& b) {
    return a.work != b.work ? a.work < b.work : a.throughput < b.throughput;
  });
  double thr;
  if (work <= pts.front().work) {
    thr = pts.front().throughput;
  } else if (work >= pts.back().work) {
    thr = pts.back().throughput;
  } else {
    size_t i = 1;
    while (pts[i].work < work) ++i;
    const ThroughputPoint& a = pts[i - 1];
    const ThroughputPoint& b = pts[i];
    const double t = (std::log(work) - std::log(a.work)) / (std::log(b.work) - std::log(a.work));
    thr = a.throughput + t * (b.throughput - a.throughput);
  }
  return work / thr;
}

namespace {

double log_distance(double a, double b) { return std::abs(std::log(a) - std::log(b)); }

// The grouped entries one lookup reads (calibration.h): of `dtype` and kind `wgrad`, at the measured (n, k)
// nearest (n, k) if within a factor of 2 of each, and of those at the group count nearest `groups`.
std::vector<const Calibration::GroupedGemm*> grouped_entries_near(const std::vector<Calibration::GroupedGemm>& all,
                                                                   int64_t groups, int64_t n, int64_t k,
                                                                   DType dtype, bool wgrad) {
  std::vector<const Calibration::GroupedGemm*> same;
  for (const auto& e : all)
    if (e.dtype == dtype && e.wgrad == wgrad) same.push_back(&e);
  if (same.empty()) return same;
  auto shape_distance = [&](const Calibration::GroupedGemm* e) {
    return log_distance(static_cast<double>(e->n), static_cast<double>(n)) +
           log_distance(static_cast<double>(e->k), static_cast<double>(k));
  };
  const auto* nearest = *std::min_element(same.begin(), same.end(), [&](const auto* a, const auto* b) {
    return shape_distance(a) < shape_distance(b);
  });
  // A kernel's efficiency depends on its shape: another expert shape's curve would time this one wrongly.
  const double factor_two = std::log(2.0) + 1e-9;
  if (log_distance(static_cast<double>(nearest->n), static_cast<double>(n)) > factor_two ||
      log_distance(static_cast<double>(nearest->k), static_cast<double>(k)) > factor_two)
    return {};
  std::erase_if(same, [&](const auto* e) { return e->n != nearest->n || e->k != nearest->k; });
  auto groups_closer = [&](const auto* a, const auto* b) {  // a tie goes to the larger count
    const double da = log_distance(static_cast<double>(a->groups), static_cast<double>(groups));
    const double db = log_distance(static_cast<double>(b->groups), static_cast<double>(groups));
    return da != db ? da < db : a->groups > b->groups;
  };
  const int64_t pick = (*std::min_element(same.begin(), same.end(), groups_closer))->groups;
  std::erase_if(same, [&](const auto* e) { return e->groups != pick; });
  return same;
}

}  // namespace

std::optional<double> Calibration::grouped_gemm_time(const std::vector<int64_t>& rows, int64_t n, int64_t k,
                                                     DType dtype, bool wgrad) const {
  const auto busy = std::count_if(rows.begin(), rows.end(), [](int64_t r) { return r > 0; });
  const auto entries = grouped_entries_near(grouped_gemm, std::max<int64_t>(busy, 1), n, k, dtype, wgrad);
  if (entries.empty()) return std::nullopt;
  // Per-group throughput over rows per group, placed at the query's per-group FLOPs of those rows so that
  // the interpolation's log(work) is log(rows); each measured time is shared evenly by its groups.
  std::vector<ThroughputPoint> pts;
  for (const auto* e : entries)
    pts.push_back({gemm_flops(e->rows, n, k),
                   gemm_flops(e->rows, e->n, e->k) * static_cast<double>(e->groups) / (e->time_us * 1e-6)});
  double total = 0;
  for (int64_t r : rows)
    if (r > 0) total += *interpolate_time(pts, gemm_flops(r, n, k));
  return total;
}

}  // namespace meshtrain::sim
