// meshtrain's pictures: SVG drawings of what the simulator, the planner and
// a training run already report, for a person to look at rather than read.
//
//   simulate --svg FILE   one SVG, two panels: the timeline of the simulated
//                         step per rank (from the Chrome trace the sim backend
//                         records for --trace) above the memory per rank (the
//                         analytic breakdown of each stage's rank against the
//                         device capacity and the simulated peak)
//   plan --svg FILE       the candidates' step time against their peak memory,
//                         the chosen one marked
//   plot METRICS --out F  the loss curve of a run's metrics file
//
// Each picture only draws data it is given: nothing is re-simulated here.
// Elements carry classes that tests (and scripts) can find: lanes are
// <g class="lane" data-rank="R">, spans <rect class="op op-CATEGORY">,
// bars <rect class="mem mem-PART">, candidates <circle class="candidate">
// and the chosen one class="candidate chosen", curves
// <polyline class="curve curve-loss">.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/pictures/svg.h"
#include "engine/planner/planner.h"
#include "engine/simulation/simulation.h"

namespace meshtrain::pictures {

// One step per rank, parsed from SimulationResult::trace_json: each rank
// (a trace process) its streams (trace threads), each stream its ops as
// spans, consecutive ops of one category merged when less than 1/2000 of
// the step apart (half a pixel of the picture), and the compute stream's
// idle gaps, exact (from the ops before merging).
struct TimelineSpan {
  double start_s = 0, end_s = 0;
  std::string category;  // compute, optimizer, a collective kind, send, recv; or idle-bubble, idle-comm
  int ops = 0;           // trace events merged into it (0 for idle)
};
struct TimelineStream {
  std::string name;  // "compute", "data-parallel 1", "send to 4"
  std::vector<TimelineSpan> spans;
};
struct TimelineRank {
  int rank = 0;
  std::vector<TimelineStream> streams;  // the compute stream first
  std::vector<TimelineSpan> idle;       // the compute stream's gaps in [0, Timeline::end_s]
};
struct Timeline {
  double end_s = 0;  // the last span's end
  std::vector<TimelineRank> ranks;
};

// An Error naming what is wrong when `trace_json` is not a trace of complete events.
Result<Timeline> timeline_from_trace(const std::string& trace_json);

// The compute stream's idle time by cause, the mean over the timeline's
// ranks: nothing to run (pipeline fill, drain and bubbles), waiting while
// another stream of the rank communicates, and waiting in a recv issued on
// the compute stream (the previous stage's activations or the next one's
// gradients). `stands_for`: by rank, the ranks a simulated rank stands for
// (StageResult::ranks), 1 where absent.
struct IdleByCause {
  double bubble_s = 0, comm_wait_s = 0, recv_wait_s = 0;
};
IdleByCause idle_by_cause(const Timeline& timeline, const std::map<int, int>& stands_for = {});

// The panels of `simulate --svg`; each draws from `top` and returns the y below it.
double draw_timeline(Svg& svg, double top, const Timeline& timeline, std::string_view heading);
double draw_memory(Svg& svg, double top, const std::vector<StageResult>& stages, double device_bytes,
                   std::string_view heading);

// simulate --svg: both panels in one document.
std::string simulation_svg(const Timeline& timeline, const SimulationResult& r, double device_bytes,
                           std::string_view title);

// plan --svg: the candidates the planner timed, `ranked` as SearchResult::ranked
// (the first is the chosen one). Full-tier times where the DES ran, the fast
// tier's otherwise; labels[i] names candidate i (the chosen one's is printed).
std::string candidates_svg(const std::vector<planner::Candidate>& ranked, double device_bytes,
                           const std::vector<std::string>& labels, std::string_view title);

// plot: one row of a metrics file (engine/training/metrics.h writes them).
struct MetricsRow {
  double step = 0, loss = 0;
  std::optional<double> val_loss, lr;
};
// Rows of a JSON-lines metrics file; an Error naming the line that is not a
// JSON object with numeric "step" and "loss". Blank lines are skipped.
Result<std::vector<MetricsRow>> parse_metrics(std::string_view text, std::string_view file);
std::string loss_svg(const std::vector<MetricsRow>& rows, std::string_view title);

}  // namespace meshtrain::pictures
