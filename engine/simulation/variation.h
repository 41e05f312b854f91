// What-if variation for a simulated run: slow ranks (stragglers) and
// degraded or failed cables, as `meshtrain simulate` takes them.
//
//   --straggler RANKS:FACTOR     RANKS: "17", "3,5,9", "8-15" or a mix; FACTOR:
//                                 compute time multiplier (1.3: 30% slower)
//   --straggler random:P:FACTOR  round(P · world) ranks (at least one), drawn
//                                 with the run's seed (the same seed, the same ranks)
//   --link-degrade CABLE:FACTOR  the cable keeps FACTOR (0 < FACTOR <= 1) of its bandwidth
//   --link-fail CABLE            the cable is down; traffic reroutes or the job stops
// Cables are named as simulator/topology.h names them (node3.nic5,
// leaf2-spine7, node0.gpu3, node1.pcie2). A rank or a cable given twice is an
// error, and every what-if applied is listed in the report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/sim/sim_cluster.h"
#include "core/status.h"

namespace meshtrain {

struct Variation {
  std::map<int, double> stragglers;  // rank -> compute factor
  std::vector<LinkChange> links;
  bool empty() const { return stragglers.empty() && links.empty(); }
};

// Parses every --straggler spec for a world of `world` ranks.
Result<std::map<int, double>> parse_stragglers(const std::vector<std::string>& specs, int world,
                                               std::uint64_t seed);
// "CABLE:FACTOR" (degrade) and "CABLE" (fail); the cable's name is checked
// when the cluster is built.
Result<LinkChange> parse_link_degrade(const std::string& spec);
LinkChange link_failure(const std::string& cable);
// Adds one --link-degrade or --link-fail to `v`; a cable changed twice (failed
// and degraded, failed twice, degraded twice) is refused naming both flags.
Status add_link_change(Variation& v, LinkChange change);
// One line per applied what-if, for the report: "cable node0.nic0 failed".
std::vector<std::string> describe_variation(const Variation& v);

// "rank 17 ×1.30, rank 40 ×1.30" (at most `limit` listed, then "... and N more").
std::string describe_stragglers(const std::map<int, double>& stragglers, std::size_t limit = 8);

}  // namespace meshtrain
