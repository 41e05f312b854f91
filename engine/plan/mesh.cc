#include "engine/plan/mesh.h"

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
      id_base_(plan.group_id_base) {}

int Mesh::group_count(GroupKind k) const {
  switch (k) {
    case GroupKind::tensor: return cp_ * dp_ * pp_;
    case GroupKind::context: return tp_ * dp_ * pp_;
    case GroupKind::data: return tp_ * cp_ * pp_;
    case GroupKind::pipeline:
    case GroupKind::embedding: return tp_ * cp_ * dp_;
    case GroupKind::model_parallel: return cp_ * dp_;
    case GroupKind::expert: return pp_ * edp() * etp_;
    case GroupKind::expert_data: return pp_ * ep_ * etp_;
    case GroupKind::expert_tensor: return pp_ * edp() * ep_;
    case GroupKind::expert_model: return pp_ * edp();
    case GroupKind::data_context: return tp_ * pp_;
  }
  return 0;
}

int Mesh::group_count() const {
  int n = 0;
  for (int k = 0; k < kGroupKinds; ++k) n += group_count(static_cast<GroupKind>(k));
  return n;
}

// Each kind fixes some coordinates and varies the others; its groups are
// ordered by the fixed ones, slowest (pipeline) last, which is the order of
// their first ranks because the rank numbering has the same nesting.
int Mesh::index_of(GroupKind k, int rank) const {
  if (rank < first_ || rank >= first_ + world_) return -1;
  const Coord c = coord_of(rank);
  const int local = (rank - first_) % (tp_ * cp_ * dp_);  // the expert mesh's stage-local index
  const int e_tp = local % etp_, e_p = local / etp_ % ep_, e_dp = local / (etp_ * ep_);
  switch (k) {
    case GroupKind::tensor: return c.cp + cp_ * (c.dp + dp_ * c.pp);
    case GroupKind::context: return c.tp + tp_ * (c.dp + dp_ * c.pp);
    case GroupKind::data: return c.tp + tp_ * (c.cp + cp_ * c.pp);
    case GroupKind::embedding:
      if (c.pp != 0 && c.pp != pp_ - 1) return -1;
      [[fallthrough]];
    case GroupKind::pipeline: return c.tp + tp_ * (c.cp + cp_ * c.dp);
    case GroupKind::model_parallel: return c.cp + cp_ * c.dp;
    case GroupKind::expert: return e_tp + etp_ * (e_dp + edp() * c.pp);
    case GroupKind::expert_data: return e_tp + etp_ * (e_p + ep_ * c.pp);
    case GroupKind::expert_tensor: return e_p + ep_ * (e_dp + edp() * c.pp);
    case GroupKind::expert_model: return e_dp + edp() * c.pp;
    case GroupKind::data_context: return c.tp + tp_ * c.pp;
  }
  return -1;
}

Group Mesh::group(GroupKind k, int i) const {
  Group g;
  g.id = id_base_ + i;
  for (int j = 0; j < static_cast<int>(k); ++j) g.id += group_count(static_cast<GroupKind>(j));
  std::vector<int>& r = g.ranks;
  switch (k) {
    case GroupKind::tensor:
      for (int t = 0; t < tp_; ++t) r.push_back(first_ + tp_ * i + t);
      break;
    case GroupKind::context:
      for (int x = 0; x < cp_; ++x) r.push_back(rank_of({i % tp_, x, i / tp_ % dp_, i / (tp_ * dp_)}));
      break;
    case GroupKind::data:
      for (int d = 0; d < dp_; ++d) r.push_back(rank_of({i % tp_, i / tp_ % cp_, d, i / (tp_ * cp_)}));
      break;
    case GroupKind::pipeline:
      for (int s = 0; s < pp_; ++s) r.push_back(rank_of({i % tp_, i / tp_ % cp_, i / (tp_ * cp_), s}));
      break;
    case GroupKind::embedding:
      r.push_back(rank_of({i % tp_, i / tp_ % cp_, i / (tp_ * cp_), 0}));
      if (pp_ > 1) r.push_back(rank_of({i % tp_, i / tp_ % cp_, i / (tp_ * cp_), pp_ - 1}));
      break;
    case GroupKind::model_parallel:  // every (tp, pp) rank of one (dp, cp) slice, ascending
      for (int s = 0; s < pp_; ++s)
        for (int t = 0; t < tp_; ++t) r.push_back(rank_of({t, i % cp_, i / cp_, s}));
      break;
    case GroupKind::expert:
      for (int e = 0; e < ep_; ++e) r.push_back(expert_rank(i / etp_ / edp(), i % etp_, e, i / etp_ % edp()));
      break;
    case GroupKind::expert_data:
      for (int d = 0; d < edp(); ++d) r.push_back(expert_rank(i / etp_ / ep_, i % etp_, i / etp_ % ep_, d));
      break;
    case GroupKind::expert_tensor:
      for (int t = 0; t < etp_; ++t) r.push_back(expert_rank(i / ep_ / edp(), t, i % ep_, i / ep_ % edp()));
      break;
    case GroupKind::expert_model:
      for (int e = 0; e < ep_; ++e)
        for (int t = 0; t < etp_; ++t) r.push_back(expert_rank(i / edp(), t, e, i % edp()));
      break;
    case GroupKind::data_context:
      for (int d = 0; d < dp_; ++d)
        for (int x = 0; x < cp_; ++x) r.push_back(rank_of({i % tp_, x, d, i / tp_}));
      break;
  }
  return g;
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
  const int i = index_of(k, rank);
  if (i < 0) return nullptr;
  std::lock_guard lock(built_->mutex);
  auto [it, added] = built_->groups.try_emplace({static_cast<int>(k), i});
  if (added) it->second = group(k, i);
  return &it->second;
}

}  // namespace meshtrain
