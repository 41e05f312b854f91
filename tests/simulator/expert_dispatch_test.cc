// The deduplicating all-to-all (sim::Algorithm::kDeduplicated, DeepEP and
// HybridEP's dispatch) against a count made token by token: every top-k
// choice of a small case routed as those dispatchers route it, without the
// closed form the simulator uses.
#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "simulator/collective.h"

using namespace meshtrain::sim;

namespace {

// Every K-subset of {0..E-1}, in lexicographic order.
std::vector<std::vector<int>> choices(int E, int K) {
  std::vector<std::vector<int>> out;
  std::vector<int> c(static_cast<std::size_t>(K));
  for (int i = 0; i < K; ++i) c[static_cast<std::size_t>(i)] = i;
  while (true) {
    out.push_back(c);
    int i = K - 1;
    while (i >= 0 && c[static_cast<std::size_t>(i)] == E - K + i) --i;
    if (i < 0) return out;
    ++c[static_cast<std::size_t>(i)];
    for (int j = i + 1; j < K; ++j) c[static_cast<std::size_t>(j)] = c[static_cast<std::size_t>(j - 1)] + 1;
  }
}

struct Bytes {
  double inter = 0, intra = 0;  // over the network, over NVLink
};

// Bytes a plan moves, flow by flow.
Bytes plan_bytes(const Cluster& c, const CollectivePlan& p) {
  Bytes b;
  for (const auto& step : p.steps)
    for_each_flow(p, step, [&](int src, int dst) {
      (c.node_of(src) == c.node_of(dst) ? b.intra : b.inter) += step.bytes * step.repeats;
    });
  return b;
}

}  // namespace

TEST_CASE("expert_hit_probability is the share of top-k choices that hit", "[simulator][collective]") {
  for (auto [E, K, held] : {std::tuple{8, 2, 4}, {8, 2, 2}, {12, 3, 5}, {6, 4, 3}, {5, 5, 1}, {7, 1, 0}}) {
    const auto all = choices(E, K);
    int hits = 0;
    for (const auto& c : all) hits += c.front() < held ? 1 : 0;  // experts 0..held-1 are the held ones
    CHECK(expert_hit_probability(E, K, held) == Approx(static_cast<double>(hits) / all.size()));
  }
}

TEST_CASE("deduplicated all-to-all moves what DeepEP's routing of every top-k choice moves",
          "[simulator][collective]") {
  // 4 members on 2 nodes of dgx-h100, 2 each on local GPUs 0 and 1; 8
  // experts, 2 per member in member order (member m holds 2m, 2m+1); top 2.
  auto cluster = Cluster::build(*cluster_preset("dgx-h100"), 16);
  REQUIRE(cluster.ok());
  const Cluster& c = *cluster;
  const std::vector<int> members = {0, 1, 8, 9};
  const int E = 8, K = 2, per_member = 2;
  const double token_bytes = 4096.0 * 2, tokens = 840;  // tokens per member: 840 = 30 · C(8, 2)
  const auto all = choices(E, K);
  const double per_choice = tokens / all.size();

  // Each member's tokens spread evenly over the 28 choices. DeepEP: a token
  // crosses to each other node holding one of its experts once, to the GPU
  // of the sender's local rank there, which forwards it over NVLink to each
  // other GPU of that node holding one; on the sender's own node the sender
  // sends it to each other such GPU itself.
  Bytes want;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const int src = members[m];
    for (const auto& choice : all) {
      std::set<int> gpus;
      for (int e : choice) gpus.insert(members[static_cast<std::size_t>(e / per_member)]);
      std::set<int> nodes;
      for (int g : gpus) nodes.insert(c.node_of(g));
      for (int node : nodes) {
        int entry = src;  // the member of `node` on the sender's local GPU
        for (int g : members)
          if (c.node_of(g) == node && c.local_rank(g) == c.local_rank(src)) entry = g;
        if (entry != src) want.inter += per_choice * token_bytes;
        for (int g : gpus)
          if (c.node_of(g) == node && g != entry) want.intra += per_choice * token_bytes;
      }
    }
  }
  // The hand count for the network: 22 of the 28 pairs reach the other node.
  CHECK(want.inter == Approx(4 * tokens * token_bytes * 22 / 28));

  CostConstants k;
  CollectiveRequest req{CollectiveKind::kAllToAll, members, tokens * K * token_bytes};
  req.experts = E;
  req.top_k = K;
  auto plan = plan_collective(c, k, req);
  REQUIRE(plan.ok());
  CHECK(plan->algorithm == Algorithm::kDeduplicated);
  const Bytes got = plan_bytes(c, *plan);
  CHECK(got.inter == Approx(want.inter));
  CHECK(got.intra == Approx(want.intra));

  // The plain all-to-all sends every slot: half of each member's 2 per token leave the node.
  req.experts = req.top_k = 0;
  auto pairwise = plan_collective(c, k, req);
  REQUIRE(pairwise.ok());
  CHECK(pairwise->algorithm == Algorithm::kPairwise);
  CHECK(plan_bytes(c, *pairwise).inter == Approx(4 * tokens * K * token_bytes / 2));
  CHECK(plan_bytes(c, *pairwise).inter > got.inter);
  // PXN: inside each node a member sends its peer its own block and the one
  // it forwards to the other node's GPU on that rail: 4 members · 1 peer · 2 blocks of S/4.
  const double S = tokens * K * token_bytes;
  CHECK(plan_bytes(c, *pairwise).intra == Approx(4 * 1 * 2 * S / 4));
}

TEST_CASE("deduplicated all-to-all needs the experts split evenly", "[simulator][collective]") {
  auto cluster = Cluster::build(*cluster_preset("dgx-h100"), 16);
  REQUIRE(cluster.ok());
  CollectiveRequest req{CollectiveKind::kAllToAll, {0, 1, 8, 9}, 1e6};
  req.experts = 6;
  req.top_k = 2;
  CHECK_FALSE(plan_collective(*cluster, CostConstants{}, req).ok());
}
