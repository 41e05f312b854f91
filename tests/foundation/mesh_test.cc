#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "engine/plan/mesh.h"

using namespace meshtrain;

namespace {
std::vector<std::vector<int>> lists(const Mesh& m, GroupKind k) {
  std::vector<std::vector<int>> r;
  for (int i = 0; i < m.group_count(k); ++i) r.push_back(m.group(k, i).ranks);
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
    for (int i = 0; i < m.group_count(static_cast<GroupKind>(k)); ++i)
      ids.insert(m.group(static_cast<GroupKind>(k), i).id), ++count;
  CHECK(ids.size() == count);
  for (int r = 0; r < 8; ++r)
    for (GroupKind k : {GroupKind::tensor, GroupKind::data, GroupKind::pipeline, GroupKind::model_parallel})
      CHECK(m.group_of(k, r)->index_of(r) >= 0);
}

TEST_CASE("a 16384-rank mesh builds quickly", "[mesh]") {
  Plan p = plan(8, 16, 128);
  Mesh m(p);
  CHECK(m.group_count(GroupKind::tensor) == 2048);
  CHECK(m.group_count(GroupKind::data) == 128);
  CHECK(m.group_of(GroupKind::pipeline, 16383)->ranks.front() == 16383 - 15 * 1024);
}

TEST_CASE("groups computed from coordinates match grouping every rank by its fixed coordinates", "[mesh]") {
  // Independent of the mesh's index formulas: ranks are put in one group
  // when the coordinates a kind holds fixed are equal, then the groups are
  // ordered by first rank and compared with group(k, i) and group_of.
  struct Case {
    int tp, cp, dp, pp, ep, etp, first;
  };
  for (const Case& c : {Case{2, 1, 2, 4, 1, 0, 0}, Case{2, 2, 3, 2, 1, 0, 0}, Case{2, 1, 4, 2, 2, 0, 0},
                        Case{2, 1, 4, 3, 2, 1, 0}, Case{4, 1, 2, 2, 4, 1, 0}, Case{1, 2, 2, 2, 1, 0, 6}}) {
    Plan p;
    p.tp = c.tp, p.cp = c.cp, p.dp = c.dp, p.pp = c.pp, p.ep = c.ep, p.first_rank = c.first, p.group_id_base = 100;
    if (c.etp > 0) p.etp = c.etp;
    const Mesh m(p);
    const int S = c.tp * c.cp * c.dp, etp = p.expert_tp();
    // The coordinates each kind holds fixed, for the rank at stage-local index l of stage s.
    auto key = [&](GroupKind k, int rank) -> std::vector<int> {
      const Coord x = m.coord_of(rank);
      const int l = (rank - c.first) % S, e_tp = l % etp, e_p = l / etp % c.ep, e_dp = l / (etp * c.ep);
      switch (k) {
        case GroupKind::tensor: return {x.cp, x.dp, x.pp};
        case GroupKind::context: return {x.tp, x.dp, x.pp};
        case GroupKind::data: return {x.tp, x.cp, x.pp};
        case GroupKind::pipeline: return {x.tp, x.cp, x.dp};
        case GroupKind::embedding:
          if (x.pp != 0 && x.pp != c.pp - 1) return {};
          return {x.tp, x.cp, x.dp};
        case GroupKind::model_parallel: return {x.cp, x.dp};
        case GroupKind::expert: return {x.pp, e_dp, e_tp};
        case GroupKind::expert_data: return {x.pp, e_p, e_tp};
        case GroupKind::expert_tensor: return {x.pp, e_dp, e_p};
        case GroupKind::expert_model: return {x.pp, e_dp};
        case GroupKind::data_context: return {x.tp, x.pp};
      }
      return {};
    };
    std::set<int> ids;
    int total = 0;
    for (int kind = 0; kind < kGroupKinds; ++kind) {
      const auto k = static_cast<GroupKind>(kind);
      std::map<std::vector<int>, std::vector<int>> by_key;
      for (int r = c.first; r < c.first + m.world_size(); ++r)
        if (auto kk = key(k, r); !kk.empty()) by_key[kk].push_back(r);
      std::vector<std::vector<int>> expected;
      for (auto& [kk, ranks] : by_key) expected.push_back(ranks);
      std::sort(expected.begin(), expected.end());
      INFO(group_kind_name(k) << " tp " << c.tp << " cp " << c.cp << " dp " << c.dp << " pp " << c.pp << " ep "
                              << c.ep << " etp " << etp);
      REQUIRE(m.group_count(k) == static_cast<int>(expected.size()));
      for (int i = 0; i < m.group_count(k); ++i) {
        const Group g = m.group(k, i);
        CHECK(g.ranks == expected[static_cast<std::size_t>(i)]);
        ids.insert(g.id);
        for (int r : g.ranks) CHECK(m.group_of(k, r)->ranks == g.ranks);
      }
      total += m.group_count(k);
      for (int r = 0; r < c.first; ++r) CHECK(m.group_of(k, r) == nullptr);
    }
    // Ids: one per group, contiguous from the plan's base.
    CHECK(static_cast<int>(ids.size()) == total);
    CHECK(*ids.begin() == 100);
    CHECK(*ids.rbegin() == 100 + total - 1);
    CHECK(m.group_count() == total);
  }
}

TEST_CASE("a million-rank mesh lists no groups up front", "[mesh]") {
  // tp 2, pp 4, dp 131072: millions of groups, of which a rank asks for a
  // few; the data group is built when asked for.
  Plan p = plan(2, 4, 131072);
  const Mesh m(p);
  CHECK(m.group_count(GroupKind::tensor) == 4 * 131072);
  const Group* data = m.group_of(GroupKind::data, 3);
  REQUIRE(data != nullptr);
  CHECK(data->size() == 131072);
  CHECK(data->ranks[0] == 1);
  CHECK(data->ranks[1] == 3);
  CHECK(m.group_of(GroupKind::data, 3) == data);  // built once
  const Mesh copy = m;                            // shares what was built
  CHECK(copy.group_of(GroupKind::data, 1) == data);
}
