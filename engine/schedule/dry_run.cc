#include "engine/schedule/dry_run.h"

#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "engine/schedule/communication.h"
#include "engine/schedule/validate.h"

namespace meshtrain::schedule {

namespace {

// One flag per (virtual stage, microbatch).
class Flags {
 public:
  explicit Flags(const PipelineLayout& layout)
      : layout_(layout),
        bits_(static_cast<size_t>(layout.virtual_stages() * layout.microbatches), false) {}
  std::vector<bool>::reference operator()(int s, int j) {
    return bits_[static_cast<size_t>(s * layout_.microbatches + j)];
  }
  std::vector<bool>::reference operator()(const Action& a) {
    return (*this)(virtual_stage(layout_, a), a.microbatch);
  }

 private:
  PipelineLayout layout_;
  std::vector<bool> bits_;
};

// What the ranks have done so far; sends are keyed by the sender's action.
struct State {
  explicit State(const PipelineLayout& l)
      : forwarded(l),
        backwarded(l),
        act_in(l),
        grad_in(l),
        act_sent(l),
        grad_sent(l),
        act_taken(l),
        grad_taken(l),
        weighted(l) {}
  Flags forwarded, backwarded;  // compute done
  Flags act_in, grad_in;        // received on the consumer side
  Flags act_sent, grad_sent;    // issued by the sender (visible from the next step)
  Flags act_taken, grad_taken;  // sends consumed by their receive
  Flags weighted;               // weight gradients done (zero-bubble W)
};

enum class Outcome { ran, waits };

// A prerequisite of a compute action: whether it holds, and what it is ("{a} runs before its {what}").
struct Need {
  bool met;
  const char* what;
};

// Runs compute action `a` once (done(a) records it), after each of `needs`: the first unmet one is the error.
Result<Outcome> run_once(Flags& done, const Action& a, std::initializer_list<Need> needs) {
  if (done(a)) return make_error("{} runs twice", format_action(a));
  for (const Need& n : needs)
    if (!n.met) return make_error("{} runs before its {}", format_action(a), n.what);
  done(a) = true;
  return Outcome::ran;
}

// Runs `a` on rank `r` if it can; returns an Error if it never could.
Result<Outcome> step_action(const PipelineLayout& layout, State& st, const Action& a,
                            std::vector<Action>& sends_this_step) {
  const int s = virtual_stage(layout, a);
  const int last = layout.virtual_stages() - 1;
  const int j = a.microbatch;
  switch (a.kind) {
    case Action::recv_act:
    case Action::recv_grad: {
      const Action send = matching_action(layout, a);
      const bool act = a.kind == Action::recv_act;
      const int peer = virtual_stage(layout, send);
      if (peer < 0 || peer > last)
        return make_error("{} receives from virtual stage {}, which does not exist",
                          format_action(a), peer);
      Flags& sent = act ? st.act_sent : st.grad_sent;
      Flags& taken = act ? st.act_taken : st.grad_taken;
      if (!sent(send) || taken(send)) return Outcome::waits;
      taken(send) = true;
      (act ? st.act_in : st.grad_in)(a) = true;
      return Outcome::ran;
    }
    case Action::send_act:
    case Action::send_grad: {
      const bool act = a.kind == Action::send_act;
      if (!(act ? st.forwarded : st.backwarded)(a))
        return make_error("{} sends before {} computed it", format_action(a),
                          format_action(Action{act ? Action::forward : Action::backward, a.stage,
                                               a.chunk, a.microbatch}));
      const int peer = virtual_stage(layout, matching_action(layout, a));
      if (peer < 0 || peer > last)
        return make_error("{} sends to virtual stage {}, which does not exist", format_action(a),
                          peer);
      if ((act ? st.act_sent : st.grad_sent)(a))
        return make_error("{} is sent twice", format_action(a));
      sends_this_step.push_back(a);
      return Outcome::ran;
    }
    case Action::forward: {
      // The input of stage s is stage s-1's output: in memory when that stage
      // is on this rank, else only through a receive already done.
      const bool has_input = s == 0 || (layout.stages == 1 ? st.forwarded(s - 1, j) : st.act_in(a));
      return run_once(st.forwarded, a, {{has_input, "input activation arrived"}});
    }
    case Action::backward: {
      const bool has_grad =
          s == last || (layout.stages == 1 ? st.backwarded(s + 1, j) : st.grad_in(a));
      return run_once(st.backwarded, a, {{st.forwarded(a), "forward"}, {has_grad, "output gradient arrived"}});
    }
    case Action::weight:
      return run_once(st.weighted, a, {{st.backwarded(a), "backward"}});
  }
  return Outcome::waits;
}

}  // namespace

Status dry_run(const Schedule& schedule) {
  MT_TRY(check_rows(schedule));
  const PipelineLayout& layout = schedule.layout;
  const size_t ranks = schedule.ranks.size();
  State st(layout);
  std::vector<size_t> next(ranks, 0);
  std::vector<std::vector<std::string>> cells(ranks);  // [r][step]
  int step = 0;
  for (;;) {
    bool all_done = true, moved = false;
    std::vector<Action> sends;
    std::vector<std::string> column(ranks);
    for (size_t r = 0; r < ranks; ++r) {
      const auto& row = schedule.ranks[r];
      if (next[r] == row.size()) continue;
      all_done = false;
      const Action& a = row[next[r]];
      auto outcome = step_action(layout, st, a, sends);
      if (!outcome.ok())
        return std::move(outcome).error().context(fmt::format("dry run step {} rank {}", step, r));
      if (*outcome == Outcome::ran) {
        column[r] = format_cell(a);
        ++next[r];
        moved = true;
      } else {
        column[r].push_back('.');  // waited this step
      }
    }
    if (all_done) break;
    if (!moved) {
      std::string waits;
      std::vector<std::string> labels{"step:"};
      std::vector<std::vector<std::string>> grid{{}};
      for (int k = 0; k < step; ++k) grid[0].push_back(fmt::format("{}", k));
      grid[0].push_back("stuck");
      for (size_t r = 0; r < ranks; ++r) {
        labels.push_back(fmt::format("rank {}:", r));
        grid.push_back(cells[r]);
        if (next[r] == schedule.ranks[r].size()) continue;
        const Action& a = schedule.ranks[r][next[r]];
        grid.back().push_back(fmt::format("[{}]", format_cell(a)));
        waits += fmt::format("{}rank {} waits at {} for {}", waits.empty() ? "" : ", ", r,
                             format_cell(a), format_action(matching_action(layout, a)));
      }
      return make_error("pipeline deadlock at step {}: {}\n{}", step, waits,
                        format_grid(labels, grid));
    }
    for (const Action& a : sends)
      (a.kind == Action::send_act ? st.act_sent : st.grad_sent)(a) = true;
    for (size_t r = 0; r < ranks; ++r) cells[r].push_back(std::move(column[r]));
    ++step;
  }

  for (const auto& row : schedule.ranks)
    for (const Action& a : row) {
      if (a.kind != Action::send_act && a.kind != Action::send_grad) continue;
      if (!(a.kind == Action::send_act ? st.act_taken : st.grad_taken)(a))
        return make_error("dry run: {} was never received (no {})", format_action(a),
                          format_action(matching_action(layout, a)));
    }
  return ok_status();
}

}  // namespace meshtrain::schedule
