#include "engine/schedule/communication.h"

namespace meshtrain::schedule {

namespace {

// Virtual stage that the data of `a` comes from or goes to.
int peer_virtual_stage(const PipelineLayout& layout, const Action& a) {
  const int s = virtual_stage(layout, a);
  switch (a.kind) {
    case Action::send_act:
    case Action::recv_grad:
      return s + 1;
    case Action::recv_act:
    case Action::send_grad:
      return s - 1;
    case Action::forward:
    case Action::backward:
    case Action::weight:
      break;
  }
  return s;
}

Action::Kind matching_kind(Action::Kind kind) {
  switch (kind) {
    case Action::send_act:
      return Action::recv_act;
    case Action::recv_act:
      return Action::send_act;
    case Action::send_grad:
      return Action::recv_grad;
    case Action::recv_grad:
      return Action::send_grad;
    case Action::forward:
    case Action::backward:
    case Action::weight:
      break;
  }
  return kind;
}

}  // namespace

int peer_rank(const PipelineLayout& layout, const Action& a) {
  return peer_virtual_stage(layout, a) % layout.stages;
}

Action matching_action(const PipelineLayout& layout, const Action& a) {
  const int peer = peer_virtual_stage(layout, a);
  return Action{matching_kind(a.kind), peer % layout.stages, peer / layout.stages, a.microbatch};
}

Result<Schedule> insert_communication(const Schedule& compute) {
  const PipelineLayout& layout = compute.layout;
  MT_TRY(check_layout(layout));
  const int last = layout.virtual_stages() - 1;
  // With one rank every neighbour is local; with more, s±1 is never on rank s % p.
  const bool remote = layout.stages > 1;
  Schedule out;
  out.layout = layout;
  out.ranks.resize(compute.ranks.size());
  for (size_t r = 0; r < compute.ranks.size(); ++r) {
    auto& row = out.ranks[r];
    for (const Action& a : compute.ranks[r]) {
      if (!a.is_compute())
        return make_error(
            "insert_communication: rank {} already has communication action {}; pass the "
            "compute schedule from a builder",
            r, format_action(a));
      const int s = virtual_stage(layout, a);
      auto with_kind = [&](Action::Kind k) { return Action{k, a.stage, a.chunk, a.microbatch}; };
      if (a.kind == Action::weight) {
        row.push_back(a);  // parameter gradients: nothing crosses a stage
      } else if (a.kind == Action::forward) {
        if (remote && s > 0) row.push_back(with_kind(Action::recv_act));
        row.push_back(a);
        if (remote && s < last) row.push_back(with_kind(Action::send_act));
      } else {
        if (remote && s < last) row.push_back(with_kind(Action::recv_grad));
        row.push_back(a);
        if (remote && s > 0) row.push_back(with_kind(Action::send_grad));
      }
    }
  }
  return out;
}

}  // namespace meshtrain::schedule
