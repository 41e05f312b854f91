#include "engine/pictures/svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace meshtrain::pictures {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') out += '?';
        else out += c;
    }
  }
  return out;
}

double Scale::operator()(double v) const {
  if (hi == lo) return (px_lo + px_hi) / 2;
  return px_lo + (v - lo) / (hi - lo) * (px_hi - px_lo);
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo) || target < 1 || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  // Index from an integer so that accumulated rounding never skips or adds a tick.
  const auto first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  for (long long i = first; i * step <= hi + step * 1e-9; ++i) ticks.push_back(i * step == 0 ? 0.0 : i * step);
  return ticks;
}

std::string tick_label(double v, double spacing) {
  int decimals = 0;
  if (spacing > 0 && spacing < 1) decimals = std::min(6, static_cast<int>(std::ceil(-std::log10(spacing) - 1e-9)));
  // 2.5 steps need one more decimal than their power of ten.
  if (spacing > 0 && std::fabs(std::round(spacing * std::pow(10.0, decimals)) - spacing * std::pow(10.0, decimals)) > 1e-6)
    ++decimals;
  return fmt::format("{:.{}f}", v, decimals);
}

double text_width(std::string_view s, double size) {
  // UTF-8 continuation bytes do not start a character.
  const auto chars = std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
  return 0.6 * size * static_cast<double>(chars);
}

Svg::Svg(double width, double height, std::string_view title) : width_(width), height_(height), title_(title) {}

void Svg::rect(double x, double y, double w, double h, std::string_view fill, std::string_view cls,
               std::string_view tooltip) {
  body_ += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"", x, y,
                       std::max(0.0, w), std::max(0.0, h), xml_escape(fill));
  if (!cls.empty()) body_ += fmt::format(" class=\"{}\"", xml_escape(cls));
  if (tooltip.empty()) body_ += "/>\n";
  else body_ += fmt::format("><title>{}</title></rect>\n", xml_escape(tooltip));
}

void Svg::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width,
               std::string_view dash) {
  body_ += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" stroke-width=\"{}\"",
                       x1, y1, x2, y2, xml_escape(stroke), width);
  if (!dash.empty()) body_ += fmt::format(" stroke-dasharray=\"{}\"", xml_escape(dash));
  body_ += "/>\n";
}

void Svg::text(double x, double y, std::string_view s, double size, std::string_view anchor, std::string_view fill,
               bool bold, double rotate, bool halo) {
  body_ += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" font-size=\"{}\" text-anchor=\"{}\" fill=\"{}\"", x, y, size,
                       xml_escape(anchor), xml_escape(fill));
  if (bold) body_ += " font-weight=\"bold\"";
  if (halo) body_ += " stroke=\"white\" stroke-width=\"4\" paint-order=\"stroke\" stroke-linejoin=\"round\"";
  if (rotate != 0) body_ += fmt::format(" transform=\"rotate({} {:.2f} {:.2f})\"", rotate, x, y);
  body_ += fmt::format(">{}</text>\n", xml_escape(s));
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width,
                   std::string_view cls, std::string_view dash) {
  std::string list;
  for (const auto& [x, y] : points) list += fmt::format("{}{:.2f},{:.2f}", list.empty() ? "" : " ", x, y);
  body_ += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" "
                       "stroke-linejoin=\"round\"",
                       list, xml_escape(stroke), width);
  if (!cls.empty()) body_ += fmt::format(" class=\"{}\"", xml_escape(cls));
  if (!dash.empty()) body_ += fmt::format(" stroke-dasharray=\"{}\"", xml_escape(dash));
  body_ += "/>\n";
}

void Svg::circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke, std::string_view cls,
                 std::string_view tooltip) {
  body_ += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{}\" fill=\"{}\" stroke=\"{}\"", cx, cy, r,
                       xml_escape(fill), xml_escape(stroke));
  if (!cls.empty()) body_ += fmt::format(" class=\"{}\"", xml_escape(cls));
  if (tooltip.empty()) body_ += "/>\n";
  else body_ += fmt::format("><title>{}</title></circle>\n", xml_escape(tooltip));
}

void Svg::open_group(std::string_view cls, std::string_view attributes) {
  body_ += fmt::format("<g class=\"{}\"{}{}>\n", xml_escape(cls), attributes.empty() ? "" : " ", attributes);
  ++open_groups_;
}

void Svg::close_group() {
  if (open_groups_ == 0) return;
  body_ += "</g>\n";
  --open_groups_;
}

void Svg::x_axis(const Scale& s, double y, double grid_top, std::string_view title, int target_ticks) {
  const std::vector<double> ticks = nice_ticks(std::min(s.lo, s.hi), std::max(s.lo, s.hi), target_ticks);
  const double spacing = ticks.size() > 1 ? ticks[1] - ticks[0] : 0;
  open_group("x-axis");
  line(s.px_lo, y, s.px_hi, y, "#444");
  for (double t : ticks) {
    const double x = s(t);
    if (grid_top < y) line(x, grid_top, x, y, "#e4e4e4");
    line(x, y, x, y + 5, "#444");
    text(x, y + 18, tick_label(t, spacing), 11, "middle", "#333");
  }
  text((s.px_lo + s.px_hi) / 2, y + 36, title, 12, "middle", "#222");
  close_group();
}

void Svg::y_axis(const Scale& s, double x, double grid_right, std::string_view title, int target_ticks) {
  const std::vector<double> ticks = nice_ticks(std::min(s.lo, s.hi), std::max(s.lo, s.hi), target_ticks);
  const double spacing = ticks.size() > 1 ? ticks[1] - ticks[0] : 0;
  open_group("y-axis");
  line(x, s.px_lo, x, s.px_hi, "#444");
  double widest = 0;
  for (double t : ticks) {
    const double y = s(t);
    if (grid_right > x) line(x, y, grid_right, y, "#e4e4e4");
    line(x - 5, y, x, y, "#444");
    const std::string label = tick_label(t, spacing);
    widest = std::max(widest, text_width(label, 11));
    text(x - 8, y + 4, label, 11, "end", "#333");
  }
  const double ty = (s.px_lo + s.px_hi) / 2;
  text(x - 16 - widest, ty, title, 12, "middle", "#222", false, -90);
  close_group();
}

double Svg::legend(double x, double y, double max_width, const std::vector<LegendEntry>& entries) {
  open_group("legend");
  double cx = x, cy = y;
  for (const LegendEntry& e : entries) {
    const double w = 18 + text_width(e.label, 11) + 16;
    if (cx > x && cx + w > x + max_width) {
      cx = x;
      cy += 18;
    }
    rect(cx, cy, 12, 12, e.colour, "legend-swatch");
    text(cx + 17, cy + 10, e.label, 11);
    cx += w;
  }
  close_group();
  return cy + 18 - y;
}

std::string Svg::str() const {
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<title>{2}</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"white\"/>\n",
      width_, height_, xml_escape(title_));
  out += body_;
  for (int i = 0; i < open_groups_; ++i) out += "</g>\n";
  return out + "</svg>\n";
}

}  // namespace meshtrain::pictures
