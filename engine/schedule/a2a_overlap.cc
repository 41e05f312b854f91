#include "engine/schedule/a2a_overlap.h"

#include <cstddef>
#include <map>
#include <tuple>

namespace meshtrain::schedule {

PairedSchedule pair_forward_backward(const Schedule& compute) {
  PairedSchedule out{compute, {}};
  for (auto& row : out.compute.ranks)
    for (std::size_t i = 0; i + 1 < row.size(); ++i)
      if (row[i].kind == Action::backward && row[i + 1].kind == Action::forward) {
        std::swap(row[i], row[i + 1]);
        out.pairs.push_back({row[i], row[i + 1]});
        ++i;  // the backward moved one place only: the next pair starts after it
      }
  return out;
}

Schedule hoist_pair_communication(const Schedule& full, const std::vector<Pair>& pairs) {
  // Each pair's backward, by its forward's (stage, chunk, micro-batch).
  std::map<std::tuple<int, int, int>, Action> backward_of;
  for (const Pair& p : pairs) backward_of[{p.forward.stage, p.forward.chunk, p.forward.microbatch}] = p.backward;
  Schedule out = full;
  for (auto& row : out.ranks) {
    std::vector<Action> rewritten;
    rewritten.reserve(row.size());
    for (std::size_t i = 0; i < row.size(); ++i) {
      rewritten.push_back(row[i]);
      if (row[i].kind != Action::forward) continue;
      const auto pair = backward_of.find({row[i].stage, row[i].chunk, row[i].microbatch});
      if (pair == backward_of.end()) continue;
      // Between the pair's forward and backward stand only the forward's send and the backward's receive.
      std::size_t k = i + 1;
      while (k < row.size() && !(row[k] == pair->second)) ++k;
      if (k == row.size()) continue;
      rewritten.pop_back();
      for (std::size_t j = i + 1; j < k; ++j)
        if (row[j].kind == Action::recv_grad || row[j].kind == Action::recv_act) rewritten.push_back(row[j]);
      rewritten.push_back(row[i]);
      rewritten.push_back(row[k]);
      for (std::size_t j = i + 1; j < k; ++j)
        if (row[j].kind == Action::send_act || row[j].kind == Action::send_grad) rewritten.push_back(row[j]);
      i = k;
    }
    row = std::move(rewritten);
  }
  return out;
}

}  // namespace meshtrain::schedule
