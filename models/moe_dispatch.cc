#include "models/moe_dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace meshtrain {

std::int64_t expert_capacity(float capacity_factor, std::int64_t tokens, int top_k, int experts) {
  if (capacity_factor <= 0) return 0;
  const double even = static_cast<double>(tokens) * top_k / experts;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(capacity_factor * even - 1e-9)));
}

RoutingSummary summarize_routing(const std::vector<std::int32_t>& experts, int num_experts, std::int64_t capacity) {
  RoutingSummary r;
  r.routed.assign(static_cast<std::size_t>(num_experts), 0);
  r.kept.assign(experts.size(), true);
  // Token order, then slot order: the first `capacity` assignments of each expert stay.
  for (std::size_t i = 0; i < experts.size(); ++i) {
    std::int64_t& n = r.routed[static_cast<std::size_t>(experts[i])];
    if (capacity > 0 && n >= capacity) {
      r.kept[i] = false;
      ++r.dropped;
    }
    ++n;
  }
  return r;
}

SendPlan plan_send(const std::vector<std::int32_t>& experts, const RoutingSummary& routing, int top_k,
                   int num_experts, int ep, std::int64_t first, std::int64_t rows) {
  const int local = num_experts / ep;
  const std::int64_t K = top_k;
  SendPlan p;
  p.peer_rows.assign(static_cast<std::size_t>(ep), 0);
  p.expert_rows.assign(static_cast<std::size_t>(num_experts), 0);
  p.slot_index.assign(static_cast<std::size_t>(rows * K), -1);
  const auto slot = [&](std::int64_t n, std::int64_t k) { return static_cast<std::size_t>((first + n) * K + k); };
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      if (routing.kept[slot(n, k)]) ++p.expert_rows[static_cast<std::size_t>(experts[slot(n, k)])];
  // A counting sort by expert; tokens and slots ascend within each expert.
  std::vector<std::int64_t> next(static_cast<std::size_t>(num_experts), 0);
  std::int64_t total = 0;
  for (int e = 0; e < num_experts; ++e) {
    next[static_cast<std::size_t>(e)] = total;
    total += p.expert_rows[static_cast<std::size_t>(e)];
    p.peer_rows[static_cast<std::size_t>(e / local)] += p.expert_rows[static_cast<std::size_t>(e)];
  }
  p.send_index.assign(static_cast<std::size_t>(total), 0);
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t k = 0; k < K; ++k) {
      if (!routing.kept[slot(n, k)]) continue;
      const std::int64_t at = next[static_cast<std::size_t>(experts[slot(n, k)])]++;
      p.send_index[static_cast<std::size_t>(at)] = static_cast<std::int32_t>(n);
      p.slot_index[static_cast<std::size_t>(n * K + k)] = static_cast<std::int32_t>(at);
    }
  return p;
}

ReceivePlan receive_counts(const std::vector<std::int64_t>& counts, int ep, int etp, int me) {
  const auto E = static_cast<std::size_t>(ep), T = static_cast<std::size_t>(etp);
  const std::size_t local = counts.size() / (E * T);
  ReceivePlan r;
  r.peer_rows.assign(E, 0);
  r.expert_rows.assign(local, 0);
  for (std::size_t t = 0; t < T; ++t) {
    std::int64_t at = 0;
    for (std::size_t q = 0; q < E; ++q)
      for (std::size_t e = 0; e < local; ++e) {
        const std::int64_t n = counts[(t * E + q) * local + e];
        at += n;
        r.expert_rows[e] += n;
        if (t == static_cast<std::size_t>(me)) r.peer_rows[q] += n;
      }
    r.block_rows = std::max(r.block_rows, at);
  }
  return r;
}

ReceivePlan plan_receive(const std::vector<std::int64_t>& counts, int ep, int etp, int me) {
  const auto E = static_cast<std::size_t>(ep), T = static_cast<std::size_t>(etp);
  const std::size_t local = counts.size() / (E * T);
  const auto count = [&](std::size_t t, std::size_t q, std::size_t e) { return counts[(t * E + q) * local + e]; };
  ReceivePlan r = receive_counts(counts, ep, etp, me);
  // start[t][q][e]: where etp rank t's block for peer q and local expert e begins within its block.
  std::vector<std::int64_t> start(counts.size());
  for (std::size_t t = 0; t < T; ++t) {
    std::int64_t at = 0;
    for (std::size_t q = 0; q < E; ++q)
      for (std::size_t e = 0; e < local; ++e) {
        start[(t * E + q) * local + e] = at;
        at += count(t, q, e);
      }
  }
  for (std::size_t e = 0; e < local; ++e)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t q = 0; q < E; ++q)
        for (std::int64_t i = 0; i < count(t, q, e); ++i)
          r.group_index.push_back(
              static_cast<std::int32_t>(static_cast<std::int64_t>(t) * r.block_rows + start[(t * E + q) * local + e] + i));
  r.ungroup_index.assign(T * static_cast<std::size_t>(r.block_rows), -1);
  for (std::size_t g = 0; g < r.group_index.size(); ++g)
    r.ungroup_index[static_cast<std::size_t>(r.group_index[g])] = static_cast<std::int32_t>(g);
  return r;
}

namespace {

// `total` split over the weights by largest remainder (ties: the lower index).
std::vector<std::int64_t> apportion(const std::vector<double>& weights, std::int64_t total) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<std::int64_t> out(weights.size(), 0);
  if (sum <= 0 || total <= 0) return out;
  std::vector<std::pair<double, std::size_t>> rest;
  std::int64_t given = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(total) * weights[i] / sum;
    out[i] = static_cast<std::int64_t>(std::floor(exact));
    given += out[i];
    rest.emplace_back(-(exact - std::floor(exact)), i);
  }
  std::sort(rest.begin(), rest.end());
  for (std::size_t i = 0; given < total && i < rest.size(); ++i, ++given) ++out[rest[i].second];
  return out;
}

}  // namespace

ModelledDispatch modelled_dispatch(const std::vector<double>& shares, std::int64_t tokens, std::int64_t rows,
                                   int top_k, int ep, std::int64_t capacity, int etp) {
  const int E = static_cast<int>(shares.size()), local = E / ep;
  ModelledDispatch d;
  d.routing.routed = apportion(shares, tokens * top_k);
  std::vector<double> kept(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    const std::int64_t routed = d.routing.routed[static_cast<std::size_t>(e)];
    const std::int64_t k = capacity > 0 ? std::min(routed, capacity) : routed;
    d.routing.dropped += routed - k;
    kept[static_cast<std::size_t>(e)] = static_cast<double>(k);
  }
  // This rank's share of the kept assignments: its rows' part of the micro-batch.
  const double kept_total = std::accumulate(kept.begin(), kept.end(), 0.0);
  const auto mine = apportion(kept, std::llround(kept_total * static_cast<double>(rows) / static_cast<double>(tokens)));
  std::int64_t best = -1;
  for (int q = 0; q < ep; ++q) {
    std::int64_t load = 0;
    for (int e = q * local; e < (q + 1) * local; ++e) load += mine[static_cast<std::size_t>(e)];
    if (load > best) best = load, d.busiest_rank = q;
  }
  SendPlan& s = d.send;
  s.peer_rows.assign(static_cast<std::size_t>(ep), 0);
  s.expert_rows.assign(static_cast<std::size_t>(E), 0);
  for (int e = 0; e < E; ++e) {
    s.expert_rows[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(mine[static_cast<std::size_t>(e)]);
    s.peer_rows[static_cast<std::size_t>(e / local)] += mine[static_cast<std::size_t>(e)];
  }
  // Every peer (and etp rank) routes like this one: the busiest rank receives each peer's rows for its experts.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(etp * ep * local));
  for (int t = 0; t < etp; ++t)
    for (int q = 0; q < ep; ++q)
      for (int e = 0; e < local; ++e)
        counts[static_cast<std::size_t>((t * ep + q) * local + e)] =
            mine[static_cast<std::size_t>(d.busiest_rank * local + e)];
  d.receive = receive_counts(counts, ep, etp, 0);
  return d;
}

}  // namespace meshtrain
