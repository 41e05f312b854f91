#include "engine/mesh.h"

#include <algorithm>

namespace meshtrain {

std::string group_kind_name(GroupKind k) {
  static const char* names[kGroupKinds] = {"tensor",         "context", "data",        "pipeline",
                                           "embedding",      "model_parallel", "expert", "expert_data",
                                           "expert_tensor",  "expert_model",   "data_context"};
  return names[static_cast<int>(k)];
}

Mesh::Mesh(const Plan& plan)
    : tp_(plan.tp),
      cp_(plan.cp),
      dp_(plan.dp),
      pp_(plan.pp),
      ep_(plan.ep),
      etp_(plan.expert_tp()),
      world_(plan.tp * plan.pp * plan.dp * plan.cp),
      first_(plan.first_rank),
      next_id_(plan.group_id_base) {
  for (auto& m : membership_) m.assign(static_cast<std::size_t>(first_ + world_), -1);
  // The ranks that vary one coordinate over [begin, end) by `step`, the
  // others fixed at `base`: direct, so large meshes build in linear time.
  auto vary = [&](Coord base, int Coord::*dim, int begin, int end, int step = 1) {
    std::vector<int> r;
    for (int i = begin; i < end; i += step) {
      base.*dim = i;
      r.push_back(rank_of(base));
    }
    return r;
  };
  for (int pp = 0; pp < pp_; ++pp)
    for (int dp = 0; dp < dp_; ++dp)
      for (int cp = 0; cp < cp_; ++cp) add(GroupKind::tensor, vary({0, cp, dp, pp}, &Coord::tp, 0, tp_));
  for (int pp = 0; pp < pp_; ++pp)
    for (int dp = 0; dp < dp_; ++dp)
      for (int tp = 0; tp < tp_; ++tp) add(GroupKind::context, vary({tp, 0, dp, pp}, &Coord::cp, 0, cp_));
  for (int pp = 0; pp < pp_; ++pp)
    for (int cp = 0; cp < cp_; ++cp)
      for (int tp = 0; tp < tp_; ++tp) {
        add(GroupKind::data, vary({tp, cp, 0, pp}, &Coord::dp, 0, dp_));
      }
  // The expert mesh of each stage (see mesh.h), over stage-local indices l.
  const int stage_ranks = tp_ * cp_ * dp_, etp = etp_, ep = ep_, edp = stage_ranks / (etp_ * ep_);
  for (int pp = 0; pp < pp_; ++pp) {
    const int base = first_ + pp * stage_ranks;
    auto local = [&](int e_tp, int e_p, int e_dp) { return base + e_tp + etp * (e_p + ep * e_dp); };
    for (int d = 0; d < edp; ++d) {
      std::vector<int> model;
      for (int e = 0; e < ep; ++e)
        for (int t = 0; t < etp; ++t) model.push_back(local(t, e, d));
      add(GroupKind::expert_model, std::move(model));
      for (int t = 0; t < etp; ++t) {
        std::vector<int> group;
        for (int e = 0; e < ep; ++e) group.push_back(local(t, e, d));
        add(GroupKind::expert, std::move(group));
      }
      for (int e = 0; e < ep; ++e) {
        std::vector<int> group;
        for (int t = 0; t < etp; ++t) group.push_back(local(t, e, d));
        add(GroupKind::expert_tensor, std::move(group));
      }
    }
    for (int e = 0; e < ep; ++e)
      for (int t = 0; t < etp; ++t) {
        std::vector<int> group;
        for (int d = 0; d < edp; ++d) group.push_back(local(t, e, d));
        add(GroupKind::expert_data, std::move(group));
      }
  }
  for (int dp = 0; dp < dp_; ++dp)
    for (int cp = 0; cp < cp_; ++cp)
      for (int tp = 0; tp < tp_; ++tp) {
        auto pipeline = vary({tp, cp, dp, 0}, &Coord::pp, 0, pp_);
        std::vector<int> embedding = {pipeline.front()};
        if (pipeline.back() != pipeline.front()) embedding.push_back(pipeline.back());
        add(GroupKind::pipeline, std::move(pipeline));
        add(GroupKind::embedding, std::move(embedding));
      }
  // Model-parallel: every (tp, pp) rank of one (dp, cp) slice.
  for (int dp = 0; dp < dp_; ++dp)
    for (int cp = 0; cp < cp_; ++cp) {
      std::vector<int> r;
      for (int pp = 0; pp < pp_; ++pp)
        for (int tp = 0; tp < tp_; ++tp) r.push_back(rank_of({tp, cp, dp, pp}));
      std::sort(r.begin(), r.end());
      add(GroupKind::model_parallel, std::move(r));
    }
  for (int pp = 0; pp < pp_; ++pp)
    for (int tp = 0; tp < tp_; ++tp) {
      std::vector<int> r;
      for (int dp = 0; dp < dp_; ++dp)
        for (int cp = 0; cp < cp_; ++cp) r.push_back(rank_of({tp, cp, dp, pp}));
      add(GroupKind::data_context, std::move(r));
    }
  for (auto& list : groups_)
    std::sort(list.begin(), list.end(), [](const Group& a, const Group& b) { return a.ranks[0] < b.ranks[0]; });
  for (std::size_t k = 0; k < groups_.size(); ++k)
    for (std::size_t i = 0; i < groups_[k].size(); ++i)
      for (int r : groups_[k][i].ranks) membership_[k][static_cast<std::size_t>(r)] = static_cast<int>(i);
}

void Mesh::add(GroupKind k, std::vector<int> ranks) {
  groups_[static_cast<std::size_t>(k)].push_back(Group{next_id_++, std::move(ranks)});
}

Coord Mesh::coord_of(int rank) const {
  rank -= first_;
  Coord c;
  c.tp = rank % tp_;
  rank /= tp_;
  c.cp = rank % cp_;
  rank /= cp_;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

const Group* Mesh::group_of(GroupKind k, int rank) const {
  if (rank < 0 || rank >= first_ + world_) return nullptr;
  int i = membership_[static_cast<std::size_t>(k)][static_cast<std::size_t>(rank)];
  return i < 0 ? nullptr : &groups_[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
}

}  // namespace meshtrain
