#include <catch2/catch.hpp>

#include <set>

#include "engine/mesh.h"

using namespace meshtrain;

namespace {
std::vector<std::vector<int>> lists(const Mesh& m, GroupKind k) {
  std::vector<std::vector<int>> r;
  for (const auto& g : m.groups(k)) r.push_back(g.ranks);
  return r;
}
Plan plan(int tp, int pp, int dp, int ep = 1) {
  Plan p;
  p.tp = tp, p.pp = pp, p.dp = dp, p.ep = ep;
  return p;
}
using L = std::vector<std::vector<int>>;
}  // namespace

TEST_CASE("16 ranks with tp 2, pp 4 give Megatron-Core's groups", "[mesh]") {
  Mesh m(plan(2, 4, 2));
  CHECK(lists(m, GroupKind::tensor) == L{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(lists(m, GroupKind::pipeline) == L{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(lists(m, GroupKind::data) == L{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(lists(m, GroupKind::embedding) == L{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
  CHECK(lists(m, GroupKind::model_parallel) == L{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}});
  CHECK(m.group_of(GroupKind::embedding, 5) == nullptr);
  CHECK(m.group_of(GroupKind::tensor, 5)->ranks == std::vector<int>{4, 5});
}

TEST_CASE("rank = tp + dp·TP + pp·TP·DP and back", "[mesh]") {
  Mesh m(plan(2, 3, 4));
  for (int r = 0; r < m.world_size(); ++r) {
    Coord c = m.coord_of(r);
    CHECK(c.tp + 2 * c.dp + 2 * 4 * c.pp == r);
    CHECK(m.rank_of(c) == r);
  }
}

TEST_CASE("expert groups are carved out of data-parallel ranks", "[mesh]") {
  // tp 1, pp 1, dp 4, ep 2: expert groups of two consecutive data ranks; the
  // expert-data groups link ranks holding the same experts.
  Mesh m(plan(1, 1, 4, 2));
  CHECK(lists(m, GroupKind::expert) == L{{0, 1}, {2, 3}});
  CHECK(lists(m, GroupKind::expert_data) == L{{0, 2}, {1, 3}});
  Mesh t(plan(2, 1, 4, 2));
  CHECK(lists(t, GroupKind::expert) == L{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
}

TEST_CASE("the expert mesh: etp·ep·edp over a stage's ranks, expert tensor parallel fastest", "[mesh][moe]") {
  // tp 2, dp 4, ep 2 with etp = tp: experts split like the MLP over the tp
  // group; expert groups of two data ranks at one tp index.
  Plan p = plan(2, 2, 4, 2);
  Mesh m(p);
  CHECK(m.group_of(GroupKind::expert, 2)->ranks == std::vector<int>{0, 2});
  CHECK(m.group_of(GroupKind::expert_data, 2)->ranks == std::vector<int>{2, 6});
  CHECK(m.group_of(GroupKind::expert_tensor, 2)->ranks == std::vector<int>{2, 3});
  CHECK(m.group_of(GroupKind::expert_model, 2)->ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(m.group_of(GroupKind::expert, 9)->ranks == std::vector<int>{9, 11});  // stage 1
  // etp 1 (whole experts): the expert groups take consecutive ranks, tp ones first.
  p.etp = 1;
  Mesh w(p);
  CHECK(lists(w, GroupKind::expert).front() == std::vector<int>{0, 1});
  CHECK(w.group_of(GroupKind::expert_data, 1)->ranks == std::vector<int>{1, 3, 5, 7});
  CHECK(w.group_of(GroupKind::expert_tensor, 1)->ranks == std::vector<int>{1});
  p.ep = 4;
  Mesh wide(p);
  CHECK(wide.group_of(GroupKind::expert, 5)->ranks == std::vector<int>{4, 5, 6, 7});
  CHECK(wide.group_of(GroupKind::expert_data, 5)->ranks == std::vector<int>{1, 5});
  // Every rank sits in exactly one group of each expert kind.
  for (GroupKind k : {GroupKind::expert, GroupKind::expert_data, GroupKind::expert_tensor, GroupKind::expert_model})
    for (int r = 0; r < wide.world_size(); ++r) CHECK(wide.group_of(k, r)->index_of(r) >= 0);
}

TEST_CASE("group ids are unique and every rank is in one group per kind", "[mesh]") {
  Mesh m(plan(2, 2, 2));
  std::set<int> ids;
  std::size_t count = 0;
  for (int k = 0; k < kGroupKinds; ++k)
    for (const auto& g : m.groups(static_cast<GroupKind>(k))) ids.insert(g.id), ++count;
  CHECK(ids.size() == count);
  for (int r = 0; r < 8; ++r)
    for (GroupKind k : {GroupKind::tensor, GroupKind::data, GroupKind::pipeline, GroupKind::model_parallel})
      CHECK(m.group_of(k, r)->index_of(r) >= 0);
}

TEST_CASE("a 16384-rank mesh builds quickly", "[mesh]") {
  Plan p = plan(8, 16, 128);
  Mesh m(p);
  CHECK(m.groups(GroupKind::tensor).size() == 2048);
  CHECK(m.groups(GroupKind::data).size() == 128);
  CHECK(m.group_of(GroupKind::pipeline, 16383)->ranks.front() == 16383 - 15 * 1024);
}
