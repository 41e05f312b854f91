// simulate --svg, upper panel: the simulated step per rank, from the trace.
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/pictures/pictures.h"
#include "simulator/collective.h"

namespace meshtrain::pictures {

namespace {

// Ops of the optimizer step (the gradient norm and AdamW) told apart from the
// rest of compute: they are the step's tail, which overlap_update moves.
bool optimizer_op(const std::string& name) {
  return name == "adamw" || name == "clip_coefficient" || name == "sum_squares" || name == "axpy";
}

// The trace's category, except that a collective the sim runs on the compute
// stream as a timed kernel (latency-bound tp all-reduces) is recorded as
// compute under the collective's name: it is communication, drawn as such.
std::string category_of(const std::string& cat, const std::string& name) {
  if (cat != "compute") return cat;
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k)
    if (name == sim::collective_kind_name(static_cast<sim::CollectiveKind>(k))) return name;
  return optimizer_op(name) ? "optimizer" : "compute";
}

struct Style {
  const char* colour;
  const char* label;
};

Style style_of(const std::string& category) {
  static const std::map<std::string, Style> styles = {
      {"compute", {"#4c72b0", "compute"}},
      {"optimizer", {"#8172b3", "optimizer step (grad norm, AdamW)"}},
      {"all_reduce", {"#dd8452", "all-reduce"}},
      {"reduce_scatter", {"#c44e52", "reduce-scatter"}},
      {"all_gather", {"#55a868", "all-gather"}},
      {"all_to_all", {"#da8bc3", "all-to-all"}},
      {"broadcast", {"#937860", "broadcast"}},
      {"send_recv", {"#8c8c8c", "send/recv collective"}},
      {"send", {"#64b5cd", "send (pipeline)"}},
      {"recv", {"#ccb974", "recv: waiting for the neighbour stage"}},
      {"idle-bubble", {"#d4d4d4", "idle: nothing to run (bubble)"}},
      {"idle-comm", {"#f7c6c7", "idle: waiting for communication"}},
  };
  auto it = styles.find(category);
  return it != styles.end() ? it->second : Style{"#bbbbbb", "other"};
}

bool is_comm(const std::string& category) { return category != "compute" && category != "optimizer"; }

// Idle gaps of the compute stream's ops (sorted by start) in [0, end]:
// waiting for communication when another stream of the rank communicates
// for most of the gap, a bubble otherwise.
template <class Op>
std::vector<TimelineSpan> idle_gaps(const std::vector<Op>& compute, const TimelineRank& rank, double end) {
  std::vector<std::pair<double, double>> comm;
  for (std::size_t s = 1; s < rank.streams.size(); ++s)
    for (const TimelineSpan& span : rank.streams[s].spans)
      if (is_comm(span.category)) comm.emplace_back(span.start_s, span.end_s);
  std::vector<TimelineSpan> gaps;
  auto gap = [&](double from, double to) {
    if (to - from <= 1e-12) return;  // a picosecond: the trace's rounding
    double covered = 0;
    for (const auto& [a, b] : comm) covered += std::max(0.0, std::min(b, to) - std::max(a, from));
    gaps.push_back({from, to, covered > (to - from) / 2 ? "idle-comm" : "idle-bubble", 0});
  };
  double at = 0;
  for (const Op& op : compute) {
    gap(at, op.start);
    at = std::max(at, op.end);
  }
  gap(at, end);
  return gaps;
}

}  // namespace

Result<Timeline> timeline_from_trace(const std::string& trace_json) {
  nlohmann::json trace = nlohmann::json::parse(trace_json, nullptr, false);
  if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    return make_error("the simulation's trace is not a Chrome trace object with \"traceEvents\" (a bug: please report it)");
  // rank -> tid -> stream
  std::map<int, std::map<int, TimelineStream>> streams;
  struct Op {
    double start, end;
    std::string category;
  };
  std::map<int, std::map<int, std::vector<Op>>> ops;
  Timeline out;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    const int pid = e.value("pid", -1), tid = e.value("tid", -1);
    if (ph == "M" && e.value("name", "") == "thread_name" && tid >= 0)
      streams[pid][tid].name = e["args"].value("name", fmt::format("stream {}", tid));
    if (ph != "X") continue;
    const double start = e.value("ts", 0.0) * 1e-6, end = start + e.value("dur", 0.0) * 1e-6;
    ops[pid][tid].push_back({start, end, category_of(e.value("cat", ""), e.value("name", ""))});
    out.end_s = std::max(out.end_s, end);
  }
  if (ops.empty()) return make_error("the simulation's trace holds no ops (a bug: please report it)");
  for (auto& [pid, by_tid] : ops) {
    TimelineRank rank{pid, {}, {}};
    // The compute stream first (tid 0 on every device, trace.h), then the others in tid order.
    for (auto& [tid, list] : by_tid) {
      std::sort(list.begin(), list.end(), [](const Op& a, const Op& b) { return a.start < b.start; });
      // Compute's back-to-back kernels would be thousands of sub-pixel slivers: merged within half a pixel.
      const double merge_s = out.end_s * 5e-4;
      TimelineStream stream = streams[pid][tid];
      if (stream.name.empty()) stream.name = fmt::format("stream {}", tid);
      for (const Op& op : list) {
        if (!stream.spans.empty() && stream.spans.back().category == op.category &&
            op.start - stream.spans.back().end_s <= merge_s) {
          stream.spans.back().end_s = std::max(stream.spans.back().end_s, op.end);
          ++stream.spans.back().ops;
        } else {
          stream.spans.push_back({op.start, op.end, op.category, 1});
        }
      }
      rank.streams.push_back(std::move(stream));
    }
    out.ranks.push_back(std::move(rank));
  }
  // Every rank's compute stream is tid 0 (trace.h), sorted above.
  for (TimelineRank& rank : out.ranks) rank.idle = idle_gaps(ops[rank.rank].begin()->second, rank, out.end_s);
  return out;
}

IdleByCause idle_by_cause(const Timeline& t, const std::map<int, int>& stands_for) {
  IdleByCause out;
  double ranks = 0;
  for (const TimelineRank& rank : t.ranks) {
    const auto it = stands_for.find(rank.rank);
    const double w = it == stands_for.end() ? 1.0 : it->second;
    ranks += w;
    for (const TimelineSpan& s : rank.idle)
      (s.category == "idle-comm" ? out.comm_wait_s : out.bubble_s) += w * (s.end_s - s.start_s);
    for (const TimelineSpan& s : rank.streams.front().spans)
      if (s.category == "recv") out.recv_wait_s += w * (s.end_s - s.start_s);
  }
  if (ranks == 0) return out;
  return {out.bubble_s / ranks, out.comm_wait_s / ranks, out.recv_wait_s / ranks};
}

double draw_timeline(Svg& svg, double top, const Timeline& t, std::string_view heading) {
  constexpr double kLeft = 170, kRight = 30, kRow = 18, kRowGap = 3, kLaneGap = 12;
  const double right = svg.width() - kRight;
  // Milliseconds below a second: the axis then reads 0 ... 74.5 rather than 0 ... 0.0745.
  const bool ms = t.end_s < 1;
  const double unit = ms ? 1e3 : 1;
  const Scale x{0, t.end_s * unit, kLeft, right};
  svg.text(20, top + 18, heading, 15, "start", "#111", true);
  double y = top + 34;
  std::set<std::string> seen;
  for (const TimelineRank& rank : t.ranks) {
    svg.open_group("lane", fmt::format("data-rank=\"{}\"", rank.rank));
    const double lane_top = y;
    const double lane_h = static_cast<double>(rank.streams.size()) * (kRow + kRowGap) - kRowGap;
    svg.rect(kLeft, lane_top - 2, right - kLeft, lane_h + 4, "#fbfbfb", "lane-background");
    svg.text(20, lane_top + 13, fmt::format("rank {}", rank.rank), 13, "start", "#111", true);
    for (const TimelineStream& stream : rank.streams) {
      svg.text(kLeft - 8, y + 13, stream.name, 11, "end", "#444");
      std::vector<const TimelineSpan*> spans;
      for (const TimelineSpan& s : stream.spans) spans.push_back(&s);
      // Idle gaps over the compute stream's merged spans; those under half a pixel would only be noise.
      if (&stream == &rank.streams.front())
        for (const TimelineSpan& s : rank.idle)
          if (x(s.end_s * unit) - x(s.start_s * unit) >= 0.5) spans.push_back(&s);
      for (const TimelineSpan* span : spans) {
        const TimelineSpan& s = *span;
        const Style st = style_of(s.category);
        seen.insert(s.category);
        const double x0 = x(s.start_s * unit), x1 = x(s.end_s * unit);
        const std::string tip =
            s.ops > 0 ? fmt::format("{}: {} op{}, {:.3f} to {:.3f} {}", st.label, s.ops, s.ops == 1 ? "" : "s",
                                    s.start_s * unit, s.end_s * unit, ms ? "ms" : "s")
                      : fmt::format("{}: {:.3f} to {:.3f} {}", st.label, s.start_s * unit, s.end_s * unit,
                                    ms ? "ms" : "s");
        // At least 0.6 pixel, so that a lone short op (a pipeline send) still shows.
        svg.rect(x0, y, std::max(x1 - x0, 0.6), kRow, st.colour, "op op-" + s.category, tip);
      }
      y += kRow + kRowGap;
    }
    svg.close_group();
    y += kLaneGap - kRowGap;
  }
  svg.x_axis(x, y + 2, top + 30, ms ? "time in the step (ms)" : "time in the step (s)", 10);
  y += 48;
  std::vector<LegendEntry> legend;
  // The legend in the order of the style table's meaning: compute, communication, idle.
  for (const char* c : {"compute", "optimizer", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                        "send_recv", "send", "recv", "idle-comm", "idle-bubble"})
    if (seen.count(c)) legend.push_back({style_of(c).colour, style_of(c).label});
  y += svg.legend(kLeft, y, right - kLeft, legend);
  return y + 10;
}

}  // namespace meshtrain::pictures
