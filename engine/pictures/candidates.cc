// plan --svg: the planner's candidates, step time against peak memory.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "engine/pictures/pictures.h"

namespace meshtrain::pictures {

namespace {

struct Point {
  double memory_gib, time_s;
  bool simulated;
};

// The full tier's figures where the DES timed the candidate, the analytic ones otherwise.
Point point_of(const planner::Candidate& c) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (c.sim) return {static_cast<double>(c.sim->peak_memory_bytes) / kGiB, c.sim->iteration_s, true};
  return {c.memory.peak_bytes / kGiB, c.fast.iteration_s, false};
}

}  // namespace

std::string candidates_svg(const std::vector<planner::Candidate>& ranked, double device_bytes,
                           const std::vector<std::string>& labels, std::string_view title) {
  constexpr double kLeft = 100, kRight = 40, kTop = 60, kPlotH = 480, kGiB = 1024.0 * 1024 * 1024;
  Svg svg(1000, kTop + kPlotH + 80, title);
  svg.text(20, 28, title, 17, "start", "#000", true);
  std::vector<Point> points;
  for (const planner::Candidate& c : ranked) points.push_back(point_of(c));
  double max_mem = 0, max_t = 0;
  for (const Point& p : points) {
    max_mem = std::max(max_mem, p.memory_gib);
    max_t = std::max(max_t, p.time_s);
  }
  // The device line when it would not squeeze the candidates into a corner (as the memory panel).
  const bool device_on_scale = device_bytes > 0 && device_bytes / kGiB <= 4 * max_mem;
  if (device_on_scale) max_mem = std::max(max_mem, device_bytes / kGiB);
  const double right = svg.width() - kRight, bottom = kTop + kPlotH;
  const Scale x{0, std::max(max_mem * 1.05, 1e-3), kLeft, right};
  const Scale y{0, std::max(max_t * 1.1, 1e-6), bottom, kTop};
  svg.x_axis(x, bottom, kTop, "peak memory per rank (GiB)");
  svg.y_axis(y, kLeft, right, "step time (s)");
  if (device_on_scale) {
    const double cx = x(device_bytes / kGiB);
    svg.line(cx, kTop, cx, bottom, "#c00", 2, "8 4");
    svg.text(cx - 4, kTop + 14, fmt::format("device {}", human_bytes(device_bytes)), 11, "end", "#c00");
  } else if (device_bytes > 0) {
    svg.text(right - 4, kTop - 8, fmt::format("device memory {} is right of this scale", human_bytes(device_bytes)),
             11, "end", "#c00");
  }
  // The chosen one last, so that it is drawn above the others.
  for (std::size_t i = points.size(); i-- > 0;) {
    if (i == 0) continue;
    const Point& p = points[i];
    const std::string tip = fmt::format("#{} {}: {:.4f} s, {:.2f} GiB ({})", i + 1, i < labels.size() ? labels[i] : "",
                                        p.time_s, p.memory_gib, p.simulated ? "simulated" : "fast estimate");
    svg.circle(x(p.memory_gib), y(p.time_s), p.simulated ? 5 : 3.5, p.simulated ? "#4c72b0" : "#b8c6e0",
               p.simulated ? "#1f3a68" : "none", p.simulated ? "candidate simulated" : "candidate estimated", tip);
  }
  if (!points.empty()) {
    const Point& p = points.front();
    const double cx = x(p.memory_gib), cy = y(p.time_s);
    const std::string label = labels.empty() ? std::string("chosen") : "chosen: " + labels.front();
    svg.circle(cx, cy, 9, "#ffb000", "#000", "candidate chosen",
               fmt::format("{}: {:.4f} s, {:.2f} GiB", label, p.time_s, p.memory_gib));
    // The label goes to the side with room, and above the point unless it sits at the top.
    const std::string text = fmt::format("{} ({:.4f} s)", label, p.time_s);
    const bool left = cx + 14 + text_width(text, 12) > right;
    svg.text(left ? cx - 14 : cx + 14, cy > kTop + 30 ? cy - 12 : cy + 22, text, 12, left ? "end" : "start", "#000",
             true, 0, true);
  }
  svg.legend(kLeft, bottom + 50, right - kLeft,
             {{"#ffb000", "chosen (fastest the full simulation timed)"},
              {"#4c72b0", "timed by the full simulation"},
              {"#b8c6e0", "fast estimate only"}});
  return svg.str();
}

}  // namespace meshtrain::pictures
