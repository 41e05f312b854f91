#include "engine/schedule/timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "engine/schedule/validate.h"

namespace meshtrain::schedule {

Result<Timing> simulate_timing(const Schedule& compute, double forward, double backward, double weight) {
  MT_TRY(check_rows(compute));
  if (!(forward > 0) || !(backward > 0))
    return make_error("timing needs positive forward and backward times, got {} and {}", forward,
                      backward);
  const PipelineLayout& layout = compute.layout;
  const int last = layout.virtual_stages() - 1;
  const int m = layout.microbatches;
  for (const auto& row : compute.ranks)
    for (const Action& a : row)
      if (!a.is_compute())
        return make_error("timing takes the compute schedule, got {}", format_action(a));

  // Finish time of forward / backward (s, j); negative until it has run.
  auto index = [&](int s, int j) { return static_cast<size_t>(s * m + j); };
  std::vector<double> f_end(static_cast<size_t>((last + 1) * m), -1.0);
  std::vector<double> b_end(f_end.size(), -1.0);

  const size_t ranks = compute.ranks.size();
  std::vector<size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  Timing t;
  t.busy.assign(ranks, 0.0);
  // Each sweep runs every action whose inputs have finished; a sweep that
  // runs nothing while work is left means the rest waits on itself.
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < ranks; ++r) {
      const auto& row = compute.ranks[r];
      while (next[r] < row.size()) {
        const Action& a = row[next[r]];
        const int s = virtual_stage(layout, a), j = a.microbatch;
        double ready = clock[r];
        if (a.kind == Action::weight) {
          if (b_end[index(s, j)] < 0) break;
          ready = std::max(ready, b_end[index(s, j)]);
        } else if (a.kind == Action::forward) {
          if (s > 0) {
            if (f_end[index(s - 1, j)] < 0) break;
            ready = std::max(ready, f_end[index(s - 1, j)]);
          }
        } else {
          if (f_end[index(s, j)] < 0) break;
          ready = std::max(ready, f_end[index(s, j)]);
          if (s < last) {
            if (b_end[index(s + 1, j)] < 0) break;
            ready = std::max(ready, b_end[index(s + 1, j)]);
          }
        }
        const double d = a.kind == Action::forward ? forward : a.kind == Action::weight ? weight : backward;
        if (a.kind != Action::weight) (a.kind == Action::forward ? f_end : b_end)[index(s, j)] = ready + d;
        clock[r] = ready + d;
        t.busy[r] += d;
        ++next[r];
        moved = true;
      }
    }
  }
  std::string stuck;
  for (size_t r = 0; r < ranks; ++r)
    if (next[r] < compute.ranks[r].size())
      stuck += fmt::format(" {}", format_action(compute.ranks[r][next[r]]));
  if (!stuck.empty())
    return make_error("timing: these actions wait on work that never finishes:{}", stuck);

  for (double c : clock) t.makespan = std::max(t.makespan, c);
  double busy = 0;
  for (double b : t.busy) busy += b;
  const double total = t.makespan * static_cast<double>(ranks);
  t.bubble_fraction = (total - busy) / total;
  return t;
}

double bubble_fraction_formula(const PipelineLayout& layout) {
  const double p = layout.stages;
  const double mv = static_cast<double>(layout.microbatches) * layout.chunks_per_stage;
  return (p - 1) / (mv + p - 1);
}

}  // namespace meshtrain::schedule
