// A small SVG writer for meshtrain's pictures (timeline, memory, planner
// candidates, loss curve): no plotting dependency, text escaped for XML,
// numbers printed with fixed precision so that one input gives one file.
//
// Coordinates are SVG user units (pixels at 100% zoom), y growing downwards.
// A Scale maps data values onto a pixel range; nice_ticks chooses the axis
// ticks a person would write (1, 2, 2.5 or 5 times a power of ten).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain::pictures {

// `text` with &, <, >, " and ' replaced by entities, and control characters
// other than tab and newline (not allowed in XML 1.0) replaced by '?'.
std::string xml_escape(std::string_view text);

// A linear map from [lo, hi] onto the pixels [px_lo, px_hi] (px_hi may be
// smaller than px_lo: a y axis). A degenerate range maps to the middle.
struct Scale {
  double lo = 0, hi = 1, px_lo = 0, px_hi = 1;
  double operator()(double v) const;
};

// About `target` ticks covering [lo, hi], at multiples of 1, 2, 2.5 or 5
// times a power of ten, all inside the range.
std::vector<double> nice_ticks(double lo, double hi, int target);
// A tick label with as many decimals as the spacing between ticks needs.
std::string tick_label(double v, double spacing);

struct LegendEntry {
  std::string colour, label;
};

class Svg {
 public:
  // The height may grow as panels are added (set_height); the document's size is written by str().
  Svg(double width, double height, std::string_view title);

  double width() const { return width_; }
  double height() const { return height_; }
  void set_height(double height) { height_ = height; }

  // `tooltip` (empty: none) becomes a <title> child, shown on hover.
  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view cls = {},
            std::string_view tooltip = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::string_view dash = {});
  // anchor: start, middle or end; rotate: degrees about (x, y); halo: a white outline that keeps the
  // text readable over markers.
  void text(double x, double y, std::string_view s, double size = 12, std::string_view anchor = "start",
            std::string_view fill = "#222", bool bold = false, double rotate = 0, bool halo = false);
  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width,
                std::string_view cls = {}, std::string_view dash = {});
  void circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke = "none",
              std::string_view cls = {}, std::string_view tooltip = {});
  // <g class="cls" extra>: `attributes` is inserted as written (callers pass escaped values).
  void open_group(std::string_view cls, std::string_view attributes = {});
  void close_group();

  // Axes of a plot area: ticks, grid lines across it and the axis title.
  void x_axis(const Scale& s, double y, double grid_top, std::string_view title, int target_ticks = 8);
  void y_axis(const Scale& s, double x, double grid_right, std::string_view title, int target_ticks = 6);
  // Swatches and labels in rows from (x, y), wrapping at x + max_width; returns the height used.
  double legend(double x, double y, double max_width, const std::vector<LegendEntry>& entries);

  // The whole document (closes any group left open).
  std::string str() const;

 private:
  double width_, height_;
  std::string title_, body_;
  int open_groups_ = 0;
};

// A rough width of `s` in pixels at font size `size` (sans-serif averages
// about 0.6 em per character): enough to lay out labels without overlap.
double text_width(std::string_view s, double size);

}  // namespace meshtrain::pictures
