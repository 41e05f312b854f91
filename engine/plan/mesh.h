// Mesh: global ranks ↔ (tp, cp, dp, pp) coordinates, and every process group.
//
// Groups are computed from the coordinates when asked for, not listed up
// front: a rank needs about ten of them, and a million-rank mesh holds
// millions (listing them cost seconds and gigabytes per simulated stage).
// Group i of a kind is the i-th in ascending order of its first rank; its id
// is the mesh's id base + the groups of the kinds before it + i.
//
// Layout as Megatron-Core: tensor parallel fastest, then context, then data,
// pipeline slowest, so a tensor-parallel group is a block of consecutive ranks
// (one node, NVLink) and a pipeline group strides across nodes:
//
//     rank = first + tp + TP·(cp + CP·(dp + DP·pp))
//
// where first is 0, or a plan segment's first global rank (Plan::first_rank;
// its groups' ids then start at Plan::group_id_base).
//
// Expert parallelism follows Megatron-Core's expert mesh: within a pipeline
// stage the TP·CP·DP ranks, numbered l = tp + TP·(cp + CP·dp), are laid out
// again as (etp, ep, edp), expert tensor parallel fastest:
//
//     etp = l % ETP,   ep = (l / ETP) % EP,   edp = l / (ETP·EP)
//
// With ETP = TP (the default) and CP = 1 that is the data index d carved into
// expert groups of EP consecutive data indices [d - d % EP, d - d % EP + EP)
// at one tp index, and expert-data groups of the ranks with equal d % EP
// (they hold the same experts). With ETP = 1 the expert groups take
// consecutive ranks, tensor-parallel ones first. Groups: expert (EP, the
// all-to-all), expert_data (the replicas of the same experts: their
// gradients' reduction and ZeRO), expert_tensor (ETP), expert_model (every
// rank of one edp index in the stage: each expert shard once).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "engine/plan/plan.h"

namespace meshtrain {

struct Coord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  bool operator==(const Coord&) const = default;
};

enum class GroupKind {
  tensor,
  context,
  data,
  pipeline,
  embedding,
  model_parallel,
  expert,
  expert_data,
  expert_tensor,
  expert_model,
  // The dp·cp ranks of one (tp, pp) place: they hold the same parameters, so
  // under context parallelism gradients are reduced (and ZeRO shards) over
  // them, as Megatron-Core's data-parallel-with-context group.
  data_context
};
inline constexpr int kGroupKinds = 11;
std::string group_kind_name(GroupKind k);

class Mesh {
 public:
  explicit Mesh(const Plan& plan);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int etp() const { return etp_; }

  int first_rank() const { return first_; }
  int rank_of(Coord c) const { return first_ + c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp)); }
  Coord coord_of(int rank) const;

  // How many groups of kind `k` (of every kind) the mesh has.
  int group_count(GroupKind k) const;
  int group_count() const;
  // Group `i` (in [0, group_count(k))) of kind `k`.
  Group group(GroupKind k, int i) const;
  // The group of kind `k` that contains `rank`, or nullptr (embedding groups
  // leave the middle pipeline stages out; a segment's mesh every rank
  // outside it). Built on first use and kept (thread-safe; copies of the
  // mesh share what was built), so the pointer stays valid while a copy lives.
  const Group* group_of(GroupKind k, int rank) const;

 private:
  // The index of the group of kind `k` holding `rank` (in the mesh), or -1.
  int index_of(GroupKind k, int rank) const;
  // The ranks of the expert mesh's local index (etp, ep, edp) in stage pp.
  int expert_rank(int pp, int e_tp, int e_p, int e_dp) const {
    return first_ + pp * tp_ * cp_ * dp_ + e_tp + etp_ * (e_p + ep_ * e_dp);
  }
  int edp() const { return tp_ * cp_ * dp_ / (etp_ * ep_); }

  int tp_, cp_, dp_, pp_, ep_, etp_, world_, first_;
  int id_base_;
  struct Built {
    std::mutex mutex;
    std::map<std::pair<int, int>, Group> groups;  // by (kind, index); a map keeps addresses
  };
  std::shared_ptr<Built> built_ = std::make_shared<Built>();
};

}  // namespace meshtrain
