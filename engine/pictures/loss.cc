// meshtrain plot: the loss curve of a run's metrics file.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "engine/pictures/pictures.h"

namespace meshtrain::pictures {

namespace {

// Every field `meshtrain train --metrics` writes (engine/training/metrics.cc): others are misspellings.
const std::vector<std::string> kMetricsFields = {
    "step",         "loss",           "lr",        "step_time_s",         "tokens_per_s",
    "val_loss",     "val_accuracy",   "aux_loss",  "z_loss",              "moe_balance",
    "expert_load_max_mean", "expert_load_mean_max_mean", "dropped_fraction", "tokens_per_expert",
    "slowest_rank", "slowest_compute_s", "median_compute_s", "straggler_lag_s", "rank_compute_s",
    "rank_comm_s"};

// One line's row; every field it holds is checked, the ones plotted and the rest.
Result<MetricsRow> metrics_row(const nlohmann::json& j) {
  MT_ASSIGN(const JsonFields f, JsonFields::of(j, "metrics field", "not a JSON object; a metrics file has one object "
                                                                   "per line, as `meshtrain train --metrics` writes it"));
  MT_TRY(f.check_known(kMetricsFields));
  MT_TRY(f.require({"step", "loss"}, "each line needs \"step\" and \"loss\" (e.g. {\"step\": 1, \"loss\": 3.2})"));
  MetricsRow row;
  std::int64_t step = 0;
  MT_TRY(f.get_int("step", IntRange{1, std::int64_t{1} << 53}, step));
  row.step = static_cast<double>(step);
  if (!f.at("loss").is_number() || !std::isfinite(f.at("loss").get<double>()))
    return make_error("the loss is not finite; the run diverged at step {}", step);
  MT_TRY(f.get_real("loss", RealRange{}, row.loss));
  MT_TRY(f.get_real("val_loss", RealRange{}, row.val_loss));
  MT_TRY(f.get_real("lr", RealRange{0, 1e6}, row.lr));
  // Times, rates, shares and ranks cannot be negative.
  double unused = 0;
  for (const char* key : {"step_time_s", "tokens_per_s", "slowest_compute_s", "median_compute_s", "straggler_lag_s",
                          "expert_load_max_mean", "expert_load_mean_max_mean"})
    MT_TRY(f.get_real(key, RealRange{0, 1e300}, unused));
  for (const char* key : {"val_accuracy", "dropped_fraction"}) MT_TRY(f.get_real(key, RealRange{0, 1}, unused));
  int rank = 0;
  MT_TRY(f.get_int("slowest_rank", IntRange{0, 1 << 20}, rank));
  return row;
}

}  // namespace

Result<std::vector<MetricsRow>> parse_metrics(std::string_view text, std::string_view file) {
  std::vector<MetricsRow> rows;
  std::size_t line_no = 0, at = 0;
  while (at < text.size()) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto j = parse_json(line, fmt::format("{} line {}", file, line_no));
    if (!j.ok()) return std::move(j).error();
    auto row = metrics_row(*j);
    if (!row.ok()) return std::move(row.context(fmt::format("{} line {}", file, line_no))).error();
    rows.push_back(*row);
  }
  if (rows.empty()) return make_error("{} holds no metrics rows; give the file `meshtrain train --metrics` wrote", file);
  return rows;
}

std::string loss_svg(const std::vector<MetricsRow>& rows, std::string_view title) {
  constexpr double kLeft = 90, kRight = 90, kTop = 60, kPlotH = 420;
  Svg svg(1000, kTop + kPlotH + 80, title);
  svg.text(20, 28, title, 17, "start", "#000", true);
  double lo_step = rows.front().step, hi_step = rows.front().step;
  double lo = rows.front().loss, hi = rows.front().loss, max_lr = 0;
  bool any_val = false, any_lr = false;
  for (const MetricsRow& r : rows) {
    lo_step = std::min(lo_step, r.step);
    hi_step = std::max(hi_step, r.step);
    lo = std::min(lo, r.loss);
    hi = std::max(hi, r.loss);
    if (r.val_loss) {
      any_val = true;
      lo = std::min(lo, *r.val_loss);
      hi = std::max(hi, *r.val_loss);
    }
    if (r.lr) {
      any_lr = true;
      max_lr = std::max(max_lr, *r.lr);
    }
  }
  const double pad = hi > lo ? (hi - lo) * 0.06 : std::max(std::fabs(hi) * 0.05, 0.05);
  const double right = svg.width() - kRight, bottom = kTop + kPlotH;
  const Scale x{lo_step, hi_step > lo_step ? hi_step : lo_step + 1, kLeft, right};
  // A non-negative loss keeps its axis at or above zero.
  const Scale y{lo >= 0 ? std::max(0.0, lo - pad) : lo - pad, hi + pad, bottom, kTop};
  svg.x_axis(x, bottom, kTop, "step");
  svg.y_axis(y, kLeft, right, "loss");
  std::vector<std::pair<double, double>> loss, val, lr;
  for (const MetricsRow& r : rows) {
    loss.emplace_back(x(r.step), y(r.loss));
    if (r.val_loss) val.emplace_back(x(r.step), y(*r.val_loss));
  }
  std::vector<LegendEntry> legend = {{"#4c72b0", "training loss"}};
  if (any_lr && max_lr > 0) {
    // The learning rate on its own axis at the right, faint: it explains the curve's bends.
    const Scale ly{0, max_lr * 1.05, bottom, kTop};
    for (const MetricsRow& r : rows)
      if (r.lr) lr.emplace_back(x(r.step), ly(*r.lr));
    svg.polyline(lr, "#999", 1.2, "curve curve-lr", "5 3");
    const std::vector<double> ticks = nice_ticks(0, max_lr * 1.05, 5);
    for (double t : ticks) {
      svg.line(right, ly(t), right + 5, ly(t), "#777");
      svg.text(right + 8, ly(t) + 4, fmt::format("{:.2g}", t), 10, "start", "#777");
    }
    svg.line(right, bottom, right, kTop, "#777");
    svg.text(right + 62, (bottom + kTop) / 2, "learning rate", 12, "middle", "#777", false, 90);
    legend.push_back({"#999", "learning rate (right axis)"});
  }
  svg.polyline(loss, "#4c72b0", 1.8, "curve curve-loss");
  if (any_val) {
    svg.polyline(val, "#dd8452", 2, "curve curve-val-loss");
    for (const auto& [px, py] : val) svg.circle(px, py, 3.5, "#dd8452", "none", "val-point");
    legend.push_back({"#dd8452", "validation loss"});
  }
  const MetricsRow& last = rows.back();
  svg.text(right - 4, kTop - 8, fmt::format("last: step {:g}, loss {:.4f}{}", last.step, last.loss,
                                            last.val_loss ? fmt::format(", val {:.4f}", *last.val_loss) : ""),
           12, "end", "#222");
  svg.legend(kLeft, bottom + 50, right - kLeft, legend);
  return svg.str();
}

}  // namespace meshtrain::pictures
