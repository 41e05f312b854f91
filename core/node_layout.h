// When a collective over host ranks runs hierarchically: the one rule that
// the cpu backend's MPI communicator follows and that the simulator applies
// when it times a cluster of host ranks (ClusterSpec::collectives "host"), so
// that both pick the same algorithm for the same group and size.
//
// A group's members are given as the node id of each member, in group order.
// The hierarchical algorithms (backends/cpu/comm/mpi_communicator.h) need
// every node to hold the same number L of members, each node's members
// contiguous in group order: then folding the nodes one after another in node
// order adds the contributions in ascending group order, as the flat
// algorithm does, and the result is the same bits. That is the layout of
// `mpirun` placing ranks by slot (the default) with groups of ascending ranks.
// A round-robin placement (--map-by node) interleaves nodes: flat.
#pragma once

#include <optional>
#include <span>

namespace meshtrain {

struct NodeBlocks {
  int nodes = 1;     // N
  int per_node = 1;  // L: members on each node
};

// The group as N nodes of L consecutive members; nullopt when the members of
// some node are not contiguous in group order or the nodes hold unequal counts.
std::optional<NodeBlocks> node_blocks(std::span<const int> member_nodes);

// Messages below this size (as nccl-tests counts it: the all-reduce buffer,
// the reduce-scatter input, the all-gather output) stay flat: the flat
// exchange takes 2 rounds of messages, the hierarchical one 2 + 2(N−1) in
// sequence (the chain across nodes), and at 64 KiB a round of latency
// (~5 µs in shared memory, ~20 µs over TCP) costs as much as the bytes saved
// at ~10 GB/s.
inline constexpr double kHierarchicalMinBytes = 64.0 * 1024;

// True when a collective of `bytes` over members on `member_nodes` runs
// hierarchically: at least 2 nodes of at least 2 members each, laid out as
// node_blocks requires, and bytes >= kHierarchicalMinBytes. With one member
// per node there is nothing to gather inside a node, and the flat exchange
// already sends each byte across the network once.
bool use_hierarchical(std::span<const int> member_nodes, double bytes);

}  // namespace meshtrain
