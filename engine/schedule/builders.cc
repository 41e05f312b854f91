#include "engine/schedule/builders.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/names.h"

namespace meshtrain::schedule {

namespace {

Status check_single_chunk(const PipelineLayout& layout, std::string_view name) {
  MT_TRY(check_layout(layout));
  if (layout.chunks_per_stage != 1)
    return make_error(
        "{} runs one model chunk per stage, got chunks_per_stage={}; use the interleaved "
        "schedule for virtual stages or set chunks_per_stage=1",
        name, layout.chunks_per_stage);
  return ok_status();
}

Schedule empty_schedule(const PipelineLayout& layout) {
  Schedule s;
  s.layout = layout;
  s.ranks.resize(static_cast<size_t>(layout.stages));
  return s;
}

Action compute(Action::Kind kind, int rank, int chunk, int microbatch) {
  return Action{kind, rank, chunk, microbatch};
}

// A schedule of one chunk per stage (`name` in its message), rank r's row filled by fill_row(row, r).
template <class FillRow>
Result<Schedule> single_chunk_schedule(const PipelineLayout& layout, std::string_view name, FillRow fill_row) {
  MT_TRY(check_single_chunk(layout, name));
  Schedule s = empty_schedule(layout);
  for (int r = 0; r < layout.stages; ++r) fill_row(s.ranks[static_cast<size_t>(r)], r);
  return s;
}

// 1F1B's order on rank r: the warm-up forwards, then a forward and a backward in turn, then the
// remaining backwards; backward(j) appends micro-batch j's backward work.
template <class Backward>
void one_f_one_b_row(std::vector<Action>& row, const PipelineLayout& layout, int r, Backward backward) {
  const int m = layout.microbatches, warmup = std::min(layout.stages - r - 1, m);
  for (int j = 0; j < warmup; ++j) row.push_back(compute(Action::forward, r, 0, j));
  for (int i = 0; i < m - warmup; ++i) {
    row.push_back(compute(Action::forward, r, 0, warmup + i));
    backward(i);
  }
  for (int j = m - warmup; j < m; ++j) backward(j);
}

}  // namespace

Result<ScheduleKind> parse_schedule_kind(std::string_view name) {
  std::vector<std::string> names;
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1}) {
    if (name == schedule_kind_name(k)) return k;
    names.emplace_back(schedule_kind_name(k));
  }
  return Error(unknown_name_message("pipeline schedule", name, names));
}

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
  }
  return "?";
}

Result<Schedule> build_gpipe(const PipelineLayout& layout) {
  return single_chunk_schedule(layout, "GPipe", [&](std::vector<Action>& row, int r) {
    for (int j = 0; j < layout.microbatches; ++j) row.push_back(compute(Action::forward, r, 0, j));
    for (int j = 0; j < layout.microbatches; ++j) row.push_back(compute(Action::backward, r, 0, j));
  });
}

Result<Schedule> build_1f1b(const PipelineLayout& layout) {
  return single_chunk_schedule(layout, "1F1B", [&](std::vector<Action>& row, int r) {
    one_f_one_b_row(row, layout, r, [&](int j) { row.push_back(compute(Action::backward, r, 0, j)); });
  });
}

Result<Schedule> build_zb_h1(const PipelineLayout& layout) {
  const int m = layout.microbatches;
  return single_chunk_schedule(layout, "ZB-H1", [&](std::vector<Action>& row, int r) {
    // W of micro-batch j follows B of micro-batch j + r.
    auto backward = [&](int j) {
      row.push_back(compute(Action::backward, r, 0, j));
      if (j - r >= 0) row.push_back(compute(Action::weight, r, 0, j - r));
    };
    one_f_one_b_row(row, layout, r, backward);
    for (int j = std::max(0, m - r); j < m; ++j) row.push_back(compute(Action::weight, r, 0, j));
  });
}

int interleaved_warmup(const PipelineLayout& layout, int rank) {
  const int p = layout.stages, v = layout.chunks_per_stage, m = layout.microbatches;
  if (m == p) return m * v;
  return std::min((p - rank - 1) * 2 + (v - 1) * p, m * v);
}

Result<Schedule> build_interleaved_1f1b(const PipelineLayout& layout) {
  MT_TRY(check_layout(layout));
  const int p = layout.stages, v = layout.chunks_per_stage, m = layout.microbatches;
  if (v < 2)
    return make_error(
        "the interleaved schedule needs at least 2 model chunks per stage, got "
        "chunks_per_stage={}; set chunks_per_stage>=2 or use 1f1b",
        v);
  if (m % p != 0) {
    const std::string fix =
        m < p ? fmt::format("use {} microbatches", p)
              : fmt::format("use {} or {} microbatches", m / p * p, (m / p + 1) * p);
    return make_error(
        "the interleaved schedule needs microbatches to be a multiple of stages, got "
        "microbatches={} stages={}; {}",
        m, p, fix);
  }
  const int group = p * v;
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % group) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / group) * p + k % p; };

  Schedule s = empty_schedule(layout);
  const int total = m * v;
  for (int r = 0; r < p; ++r) {
    auto& row = s.ranks[static_cast<size_t>(r)];
    auto forward = [&](int k) {
      row.push_back(compute(Action::forward, r, chunk_of(k, true), microbatch_of(k)));
    };
    auto backward = [&](int k) {
      row.push_back(compute(Action::backward, r, chunk_of(k, false), microbatch_of(k)));
    };
    const int warmup = interleaved_warmup(layout, r);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int i = 0; i < total - warmup; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return s;
}

Result<Schedule> build_schedule(ScheduleKind kind, const PipelineLayout& layout) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return build_gpipe(layout);
    case ScheduleKind::one_f_one_b:
      return build_1f1b(layout);
    case ScheduleKind::interleaved:
      return build_interleaved_1f1b(layout);
    case ScheduleKind::zb_h1:
      return build_zb_h1(layout);
  }
  return make_error("unknown schedule kind {}", static_cast<int>(kind));
}

}  // namespace meshtrain::schedule
