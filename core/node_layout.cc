#include "core/node_layout.h"

#include <algorithm>
#include <vector>

namespace meshtrain {

std::optional<NodeBlocks> node_blocks(std::span<const int> member_nodes) {
  if (member_nodes.empty()) return std::nullopt;
  std::vector<int> seen;  // node ids in order of first appearance
  int run = 0, per_node = 0;
  for (std::size_t i = 0; i < member_nodes.size(); ++i) {
    if (i > 0 && member_nodes[i] == member_nodes[i - 1]) {
      ++run;
      continue;
    }
    if (std::find(seen.begin(), seen.end(), member_nodes[i]) != seen.end()) return std::nullopt;
    if (i > 0 && per_node != 0 && run != per_node) return std::nullopt;
    if (i > 0) per_node = run;
    seen.push_back(member_nodes[i]);
    run = 1;
  }
  if (per_node != 0 && run != per_node) return std::nullopt;
  return NodeBlocks{static_cast<int>(seen.size()), run};
}

bool use_hierarchical(std::span<const int> member_nodes, double bytes) {
  const auto blocks = node_blocks(member_nodes);
  return blocks && blocks->nodes >= 2 && blocks->per_node >= 2 && bytes >= kHierarchicalMinBytes;
}

}  // namespace meshtrain
