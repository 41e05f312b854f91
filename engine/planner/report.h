// What `meshtrain plan` prints: the ranked table, its JSON, the winner as a
// plan file, why the winner beats the runner-up, and how far the fast tier
// agrees with the full one.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "engine/planner/planner.h"

namespace meshtrain::planner {

// Over the candidates of one kind (uniform plans, or segment layouts: each
// kind has its own fast-tier order) both tiers timed (the DES's successes):
//   spearman, kendall_tau  rank correlations of the fast estimate with the DES
//   worst_relative_error   max |fast - DES| / DES
//   reranked               how many the DES moved from their fast-tier place
//   winner_fast_rank       the DES winner's place in the fast order (0: the fast tier's own first)
struct TierAgreement {
  int compared = 0;
  double spearman = 0, kendall_tau = 0, worst_relative_error = 0;
  int reranked = 0, winner_fast_rank = -1;
};
TierAgreement tier_agreement(const SearchResult& r, bool segment_layouts = false);

// Kendall's tau-b of two equally long series (ties count for neither order).
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);

struct ReportContext {
  const SearchContext* ctx;
  const sim::ClusterSpec* cluster;
  int top = 10;
};

std::string text_report(const SearchResult& r, const ReportContext& c);
nlohmann::json json_report(const SearchResult& r, const ReportContext& c);
// Why ranked[0] beats ranked[1], in the simulator's terms; needs both simulated.
std::string explain(const SearchResult& r, const ReportContext& c);
// The candidate as a plan file that `train --plan` and `simulate --plan` read
// unchanged (a segment layout with its "segments" list).
nlohmann::json plan_file_json(const Candidate& c);

}  // namespace meshtrain::planner
