// simulate --svg, lower panel: memory per rank, the analytic breakdown
// (engine/memory/memory_model.h) stacked against the device capacity, with the
// peak the sim backend measured beside it.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "engine/pictures/pictures.h"

namespace meshtrain::pictures {

namespace {

struct Part {
  const char* cls;
  const char* colour;
  const char* label;
  double MemoryBreakdown::*field;
  double MemoryBreakdown::*extra1 = nullptr;  // folded into the part (null: none)
  double MemoryBreakdown::*extra2 = nullptr;
};

// The memory model's fields in four parts a person asks about, plus the two
// transient working sets, which are drawn only when some rank has them.
const Part kParts[] = {
    {"weights", "#4c72b0", "weights", &MemoryBreakdown::parameters},
    {"gradients", "#dd8452", "gradients", &MemoryBreakdown::gradients, &MemoryBreakdown::gradient_shard,
     &MemoryBreakdown::gradient_working},
    {"optimizer", "#55a868", "optimizer state", &MemoryBreakdown::optimizer},
    {"zero3", "#8172b3", "ZeRO-3 gathered layers", &MemoryBreakdown::zero3_working},
    {"activations", "#c44e52", "activations", &MemoryBreakdown::activations},
    {"backward", "#da8bc3", "backward working set", &MemoryBreakdown::backward_working},
};

double part_bytes(const MemoryBreakdown& m, const Part& p) {
  return m.*p.field + (p.extra1 ? m.*p.extra1 : 0) + (p.extra2 ? m.*p.extra2 : 0);
}

}  // namespace

double draw_memory(Svg& svg, double top, const std::vector<StageResult>& stages, double device_bytes,
                   std::string_view heading) {
  constexpr double kLeft = 170, kRight = 30, kPlotH = 260;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const double right = svg.width() - kRight;
  svg.text(20, top + 18, heading, 15, "start", "#111", true);
  const double plot_top = top + 40, plot_bottom = plot_top + kPlotH;
  double most = 0;
  for (const StageResult& s : stages) most = std::max({most, s.model.total(), static_cast<double>(s.peak_bytes)});
  // The capacity line is drawn when it would not flatten the bars to slivers;
  // otherwise the scale fits the ranks and the capacity is written above them.
  const bool capacity_on_scale = device_bytes > 0 && device_bytes <= 4 * most;
  const double top_bytes = (capacity_on_scale ? std::max(most, device_bytes) : most) * 1.08;
  const Scale y{0, std::max(top_bytes, 1.0) / kGiB, plot_bottom, plot_top};
  svg.y_axis(y, kLeft, right, "GiB per rank", 6);

  const double slot = (right - kLeft) / std::max<std::size_t>(stages.size(), 1);
  const double bar = std::min(80.0, slot * 0.5);
  bool any[std::size(kParts)] = {};
  for (const StageResult& s : stages)
    for (std::size_t i = 0; i < std::size(kParts); ++i) any[i] = any[i] || part_bytes(s.model, kParts[i]) > 0;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const StageResult& s = stages[k];
    const double cx = kLeft + slot * (static_cast<double>(k) + 0.5);
    svg.open_group("bar", fmt::format("data-rank=\"{}\"", s.rank));
    double base = 0;
    for (const Part& p : kParts) {
      const double b = part_bytes(s.model, p);
      if (b <= 0) continue;
      const double y0 = y(base / kGiB), y1 = y((base + b) / kGiB);
      svg.rect(cx - bar / 2, y1, bar, y0 - y1, p.colour, fmt::format("mem mem-{}", p.cls),
               fmt::format("rank {} {}: {}", s.rank, p.label, human_bytes(b)));
      base += b;
    }
    // The simulated peak: what the sim backend's allocator saw at its highest.
    const double py = y(static_cast<double>(s.peak_bytes) / kGiB);
    svg.line(cx - bar / 2 - 6, py, cx + bar / 2 + 6, py, "#111", 2.5);
    svg.text(cx + bar / 2 + 8, py + 4, human_bytes(static_cast<double>(s.peak_bytes)), 10, "start", "#111");
    // Ranks in a label row; a full-fidelity run's many ranks thin their labels so none overlap.
    const auto every = static_cast<std::size_t>(std::ceil(70.0 / slot));
    if (k % std::max<std::size_t>(every, 1) == 0) {
      svg.text(cx, plot_bottom + 16, fmt::format("rank {}", s.rank), 11, "middle", "#222");
      svg.text(cx, plot_bottom + 30, fmt::format("stage {}", s.stage), 10, "middle", "#666");
    }
    svg.close_group();
  }
  if (capacity_on_scale) {
    const double cy = y(device_bytes / kGiB);
    svg.line(kLeft, cy, right, cy, "#c00", 2, "8 4");
    svg.text(right - 4, cy - 6, fmt::format("device capacity {}", human_bytes(device_bytes)), 11, "end", "#c00");
  } else if (device_bytes > 0) {
    svg.text(right - 4, plot_top - 6,
             fmt::format("device capacity {} is above this scale ({:.0f}x the largest rank)", human_bytes(device_bytes),
                         device_bytes / std::max(most, 1.0)),
             11, "end", "#c00");
  }
  std::vector<LegendEntry> legend;
  for (std::size_t i = 0; i < std::size(kParts); ++i)
    if (any[i]) legend.push_back({kParts[i].colour, kParts[i].label});
  legend.push_back({"#111", "simulated peak (bar)"});
  return plot_bottom + 44 + svg.legend(kLeft, plot_bottom + 44, right - kLeft, legend) + 10;
}

std::string simulation_svg(const Timeline& timeline, const SimulationResult& r, double device_bytes,
                           std::string_view title) {
  Svg svg(1200, 100, title);
  svg.text(20, 28, title, 17, "start", "#000", true);
  double y = draw_timeline(svg, 40, timeline,
                           fmt::format("Timeline of the step per rank: {:.4f} s, MFU {:.1f}%, bubble {:.1f}%",
                                       r.iteration_s, 100 * r.mfu, 100 * r.bubble_fraction));
  y = draw_memory(svg, y + 10, r.stages, device_bytes, "Memory per rank: the memory model's breakdown");
  svg.set_height(y + 10);
  return svg.str();
}

}  // namespace meshtrain::pictures
