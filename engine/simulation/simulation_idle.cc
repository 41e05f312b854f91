#include "engine/simulation/simulation_idle.h"

#include <algorithm>
#include <string_view>

#include "backends/sim/sim_cluster.h"

namespace meshtrain {
namespace {

using Wait = sim::IdleCause::Wait;

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Where one cause's time goes.
double& bucket_of(const sim::IdleCause& c, IdleBreakdown& b) {
  switch (c.wait) {
    case Wait::kTransfer:
    case Wait::kNothing:
      return b.pipeline_s;
    case Wait::kPeers:
      // Members on other pipeline stages (the loss and gradient-norm
      // reductions after the schedule) arrive when their own schedule
      // ends: that wait is the pipeline's drain, not exposed TP/CP/EP.
      return ends_with(c.task, kAcrossStages) ? b.pipeline_s : b.model_parallel_s;
    case Wait::kEvent:
    case Wait::kTail:
      break;
  }
  // On the data-parallel stream a copy is the tail of a ZeRO parameter
  // all-gather (its padding cut off, sharded_optimizer.cc gather_bucket): the
  // wait was for the gather. The other kernels there are the optimizer's.
  if (starts_with(c.stream, "data-parallel")) {
    // A collective there over ranks of several stages (the tied embedding's
    // gradient between the first and last stage, the loss and the gradient
    // norm) starts when the last of its stages drains: the pipeline's wait.
    if (ends_with(c.task, kAcrossStages)) return b.pipeline_s;
    return c.communication || c.task == "copy" ? b.data_parallel_s : b.optimizer_s;
  }
  if (starts_with(c.stream, "tensor-parallel") || starts_with(c.stream, "context-parallel") ||
      starts_with(c.stream, "expert-parallel"))
    return b.model_parallel_s;
  if (starts_with(c.stream, "offload")) return b.optimizer_s;
  // A receive posted ahead on its own stream (Plan::overlap_p2p_comm): waiting for the neighbour.
  if (starts_with(c.stream, "pipeline")) return b.pipeline_s;
  return b.other_s;
}

}  // namespace

IdleBreakdown& IdleBreakdown::operator+=(const IdleBreakdown& o) {
  pipeline_s += o.pipeline_s;
  data_parallel_s += o.data_parallel_s;
  model_parallel_s += o.model_parallel_s;
  optimizer_s += o.optimizer_s;
  other_s += o.other_s;
  expert_parallel_s += o.expert_parallel_s;
  return *this;
}

IdleBreakdown IdleBreakdown::scaled(double k) const {
  return {pipeline_s * k, data_parallel_s * k, model_parallel_s * k, optimizer_s * k, other_s * k, expert_parallel_s * k};
}

IdleBreakdown classify_idle(const std::vector<sim::IdleCause>& causes) {
  IdleBreakdown b;
  for (const sim::IdleCause& c : causes) {
    bucket_of(c, b) += sim::to_seconds(c.time);
    if ((c.wait == Wait::kEvent || c.wait == Wait::kTail) && starts_with(c.stream, "expert-parallel"))
      b.expert_parallel_s += sim::to_seconds(c.time);
  }
  return b;
}

std::vector<sim::IdleCause> subtract_idle(std::vector<sim::IdleCause> two, const std::vector<sim::IdleCause>& one) {
  for (const sim::IdleCause& c : one) {
    auto it = std::find_if(two.begin(), two.end(), [&](const sim::IdleCause& t) {
      return t.wait == c.wait && t.stream == c.stream && t.task == c.task && t.communication == c.communication;
    });
    if (it != two.end()) it->time = std::max<sim::Time>(0, it->time - c.time);
  }
  return two;
}

}  // namespace meshtrain
