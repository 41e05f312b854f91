#include "backends/cpu/comm/common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meshtrain::comm {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

std::string describe(const Group& g) {
  return fmt::format("group {} (ranks [{}])", g.id, fmt::join(g.ranks, ", "));
}

std::string describe_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

Status check_group(const Group& g, int rank, int world, std::string_view op) {
  if (g.ranks.empty()) return make_error("{} on group {}: the group has no ranks", op, g.id);
  for (std::size_t i = 0; i < g.ranks.size(); ++i) {
    int r = g.ranks[i];
    if (r < 0 || r >= world)
      return make_error("{} on {}: rank {} is outside the world of {}", op, describe(g), r, world);
    if (i > 0 && g.ranks[i - 1] >= r)
      return make_error("{} on {}: ranks must be ascending and unique", op, describe(g));
  }
  if (g.index_of(rank) < 0)
    return make_error("{} on {}: called by rank {}, which is not a member", op, describe(g), rank);
  return ok_status();
}

Result<std::vector<std::size_t>> block_offsets(std::span<const std::int64_t> counts,
                                               std::size_t total, int group_size,
                                               std::string_view what) {
  if (counts.size() != static_cast<std::size_t>(group_size))
    return make_error("{} has {} entries for a group of {}", what, counts.size(), group_size);
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) return make_error("{}[{}] is negative ({})", what, i, counts[i]);
    offsets[i + 1] = offsets[i] + static_cast<std::size_t>(counts[i]);
  }
  if (offsets.back() != total)
    return make_error("{} sum to {} but the buffer holds {} elements", what, offsets.back(), total);
  return offsets;
}

}  // namespace meshtrain::comm
