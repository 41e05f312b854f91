#include "engine/schedule/validate.h"

#include <algorithm>

#include "engine/schedule/communication.h"

namespace meshtrain::schedule {

namespace {

constexpr int kKinds = 7;

// Row position of each action, keyed by (kind, virtual stage, microbatch);
// -1 where absent. Built after checking that no key repeats.
class Positions {
 public:
  explicit Positions(const PipelineLayout& layout)
      : layout_(layout),
        pos_(static_cast<size_t>(kKinds * layout.virtual_stages() * layout.microbatches), -1) {}

  int& at(Action::Kind kind, int s, int j) {
    return pos_[static_cast<size_t>((kind * layout_.virtual_stages() + s) * layout_.microbatches +
                                    j)];
  }
  int at(const Action& a) { return at(a.kind, virtual_stage(layout_, a), a.microbatch); }

 private:
  PipelineLayout layout_;
  std::vector<int> pos_;
};

Action on_stage(const PipelineLayout& layout, Action::Kind kind, int s, int j) {
  return Action{kind, s % layout.stages, s / layout.stages, j};
}

}  // namespace

Status check_rows(const Schedule& schedule) {
  const PipelineLayout& layout = schedule.layout;
  MT_TRY(check_layout(layout));
  if (static_cast<int>(schedule.ranks.size()) != layout.stages)
    return make_error("schedule has {} rank rows for {} stages", schedule.ranks.size(),
                      layout.stages);
  for (int r = 0; r < layout.stages; ++r) {
    for (const Action& a : schedule.ranks[static_cast<size_t>(r)]) {
      if (a.stage != r)
        return make_error("rank {} holds {}, an action of rank {}", r, format_action(a), a.stage);
      if (a.chunk < 0 || a.chunk >= layout.chunks_per_stage || a.microbatch < 0 ||
          a.microbatch >= layout.microbatches)
        return make_error("rank {}: {} is outside the layout ({} chunks, {} microbatches)", r,
                          format_action(a), layout.chunks_per_stage, layout.microbatches);
    }
  }
  return ok_status();
}

namespace {

// Each action's row position; an error where one appears twice.
Result<Positions> positions_of(const Schedule& schedule) {
  const PipelineLayout& layout = schedule.layout;
  Positions pos(layout);
  for (int r = 0; r < layout.stages; ++r) {
    const auto& row = schedule.ranks[static_cast<size_t>(r)];
    for (size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i];
      int& p = pos.at(a.kind, virtual_stage(layout, a), a.microbatch);
      if (p >= 0) return make_error("rank {}: {} appears twice", r, format_action(a));
      p = static_cast<int>(i);
    }
  }
  return pos;
}

// Micro-batch j on virtual stage s: its forward, backward (and, in a
// zero-bubble schedule, weight pass) in order, each after what it reads: the
// communication around it across ranks, or the neighbouring stage's compute
// on a single rank.
Status check_microbatch(const PipelineLayout& layout, Positions& pos, bool split, int s, int j) {
  const int last = layout.virtual_stages() - 1;
  const Action f = on_stage(layout, Action::forward, s, j);
  const Action b = on_stage(layout, Action::backward, s, j);
  const int fp = pos.at(f), bp = pos.at(b);
  if (fp < 0) return make_error("{} never runs", format_action(f));
  if (bp < 0) return make_error("{} has no backward {}", format_action(f), format_action(b));
  if (bp < fp) return make_error("{} comes before its forward {}", format_action(b), format_action(f));
  if (split) {
    const Action w = on_stage(layout, Action::weight, s, j);
    const int wp = pos.at(w);
    if (wp < 0) return make_error("{} has no weight gradient pass {}", format_action(b), format_action(w));
    if (wp < bp) return make_error("{} comes before its backward {}", format_action(w), format_action(b));
  }
  // `needed` must sit before (before=true) or after `user` in the same row.
  auto require = [&](const Action& user, int user_pos, const Action& needed, bool before, const char* what) -> Status {
    const int np = pos.at(needed);
    if (np < 0 || (before ? np > user_pos : np < user_pos))
      return make_error("{} needs {} {} it ({})", format_action(user), format_action(needed),
                        before ? "before" : "after", what);
    return ok_status();
  };
  if (layout.stages > 1) {
    if (s > 0) MT_TRY(require(f, fp, on_stage(layout, Action::recv_act, s, j), true, "its input activation"));
    if (s < last) MT_TRY(require(f, fp, on_stage(layout, Action::send_act, s, j), false, "the next stage's input"));
    if (s < last) MT_TRY(require(b, bp, on_stage(layout, Action::recv_grad, s, j), true, "its output gradient"));
    if (s > 0)
      MT_TRY(require(b, bp, on_stage(layout, Action::send_grad, s, j), false, "the previous stage's gradient"));
  } else {
    if (s > 0)
      MT_TRY(require(f, fp, on_stage(layout, Action::forward, s - 1, j), true, "its input activation, same rank"));
    if (s < last)
      MT_TRY(require(b, bp, on_stage(layout, Action::backward, s + 1, j), true, "its output gradient, same rank"));
  }
  return ok_status();
}

// Every communication action present has its partner; stray ones (a send
// with no compute next to it, a receive of a stage that has no sender) are
// caught here too.
Status check_partners(const Schedule& schedule, Positions& pos) {
  const PipelineLayout& layout = schedule.layout;
  const int last = layout.virtual_stages() - 1;
  for (const auto& row : schedule.ranks) {
    for (const Action& a : row) {
      if (a.is_compute()) continue;
      const int s = virtual_stage(layout, a);
      const int peer = s + ((a.kind == Action::send_act || a.kind == Action::recv_grad) ? 1 : -1);
      if (layout.stages == 1)
        return make_error("{} on a single-rank pipeline: its chunks share the rank and exchange data in memory",
                          format_action(a));
      if (peer < 0 || peer > last)
        return make_error("{} has no peer stage (virtual stage {} of {})", format_action(a), peer, last + 1);
      const Action match = matching_action(layout, a);
      if (pos.at(match) < 0) return make_error("{} has no matching {}", format_action(a), format_action(match));
    }
  }
  return ok_status();
}

}  // namespace

Status check_invariants(const Schedule& schedule) {
  const PipelineLayout& layout = schedule.layout;
  MT_TRY(check_rows(schedule));
  MT_ASSIGN(Positions pos, positions_of(schedule));
  // Zero-bubble schedules split every backward: all of them or none.
  bool split = false;
  for (const auto& row : schedule.ranks)
    for (const Action& a : row) split = split || a.kind == Action::weight;
  for (int s = 0; s < layout.virtual_stages(); ++s)
    for (int j = 0; j < layout.microbatches; ++j) MT_TRY(check_microbatch(layout, pos, split, s, j));
  return check_partners(schedule, pos);
}

InFlight peak_in_flight(const Schedule& schedule) {
  const int v = schedule.layout.chunks_per_stage;
  InFlight out;
  for (const auto& row : schedule.ranks) {
    int now = 0, peak = 0;
    std::vector<int> now_chunk(static_cast<size_t>(v), 0), peak_chunk(static_cast<size_t>(v), 0);
    for (const Action& a : row) {
      if (!a.is_compute() || a.kind == Action::weight) continue;
      const int d = a.kind == Action::forward ? 1 : -1;
      auto c = static_cast<size_t>(a.chunk);
      now += d;
      now_chunk[c] += d;
      peak = std::max(peak, now);
      peak_chunk[c] = std::max(peak_chunk[c], now_chunk[c]);
    }
    out.per_rank.push_back(peak);
    out.per_chunk.push_back(std::move(peak_chunk));
  }
  return out;
}

}  // namespace meshtrain::schedule
