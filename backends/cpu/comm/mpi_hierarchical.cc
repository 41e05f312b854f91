// The MPI communicator's hierarchical collectives (mpi_communicator.h): lanes
// inside a node, a chain in node order across nodes. Member k of the group is
// local member k % L of node k / L (core/node_layout.h guarantees the layout).
#include <algorithm>
#include <cstring>

#include "backends/cpu/comm/common.h"
#include "backends/cpu/comm/mpi_communicator.h"

namespace meshtrain {

namespace {

// Tags of the phases, apart from the flat algorithms' 0 and 1.
constexpr int kLanes = 2, kChain = 3, kResult = 4, kGather = 5;


}  // namespace

Status MpiCommunicator::chain(const std::vector<const float*>& contributions, std::size_t length,
                              float* acc, const Group& g, ReduceOp op, MPI_Comm comm, NodeBlocks nb,
                              const std::string& at) {
  const int k = g.index_of(rank_), L = nb.per_node, node = k / L;
  const std::size_t segments = (length + kChainSegment - 1) / kChainSegment;
  auto segment = [&](std::size_t s) { return std::min(kChainSegment, length - s * kChainSegment); };
  std::vector<Pending> incoming, outgoing;
  if (node > 0)
    for (std::size_t s = 0; s < segments; ++s)
      post_recv(incoming, comm, g, k - L, acc + s * kChainSegment, segment(s), kChain);
  for (std::size_t s = 0; s < segments; ++s) {
    if (node > 0) {
      std::vector<Pending> one{incoming[s]};
      incoming[s].request = MPI_REQUEST_NULL;
      if (Status st = wait_all(one, at); !st.ok()) {
        cancel(incoming);
        cancel(outgoing);
        return st;
      }
    }
    const std::size_t from = s * kChainSegment, len = segment(s);
    float* out = acc + from;
    // Node 0 starts from its first member's contribution; the others fold
    // theirs into the partial sum of the nodes before them.
    int j = 0;
    if (node == 0) comm::copy_floats(out, contributions[0] + from, len), j = 1;
    for (; j < L; ++j) comm::combine(out, contributions[static_cast<std::size_t>(j)] + from, len, op);
    if (node + 1 < nb.nodes) post_send(outgoing, comm, g, k + L, out, len, kChain);
  }
  return wait_all(outgoing, at);
}

Status MpiCommunicator::hierarchical_all_reduce(std::span<float> data, const Group& g, ReduceOp op,
                                                MPI_Comm comm, NodeBlocks nb, const std::string& at) {
  const int k = g.index_of(rank_), L = nb.per_node, N = nb.nodes;
  const int node = k / L, lane = k % L, first = node * L;
  const std::size_t n = data.size();
  auto lo = [&](int j) { return n * static_cast<std::size_t>(j) / static_cast<std::size_t>(L); };
  auto len = [&](int j) { return lo(j + 1) - lo(j); };
  const std::size_t m = len(lane);
  float* mine = data.data() + lo(lane);
  // 1. Lane `lane` of every member of this node; slot j of scratch holds member j's.
  scratch_.resize(static_cast<std::size_t>(L) * m);
  std::vector<Pending> pending;
  for (int j = 0; j < L; ++j) {
    if (j == lane) continue;
    post_recv(pending, comm, g, first + j, scratch_.data() + static_cast<std::size_t>(j) * m, m, kLanes);
    post_send(pending, comm, g, first + j, data.data() + lo(j), len(j), kLanes);
  }
  MT_TRY(wait_all(pending, at));
  std::vector<const float*> contributions;
  for (int j = 0; j < L; ++j)
    contributions.push_back(j == lane ? mine : scratch_.data() + static_cast<std::size_t>(j) * m);
  // 2. The chain; the last node holds the sum of lane `lane` and sends it back.
  chain_.resize(m);
  MT_TRY(chain(contributions, m, chain_.data(), g, op, comm, nb, at));
  pending.clear();
  if (node == N - 1) {
    comm::copy_floats(mine, chain_.data(), m);
    for (int b = 0; b < N - 1; ++b) post_send(pending, comm, g, b * L + lane, mine, m, kResult);
  } else {
    post_recv(pending, comm, g, (N - 1) * L + lane, mine, m, kResult);
  }
  MT_TRY(wait_all(pending, at));
  // 3. All-gather of the lanes inside the node.
  pending.clear();
  for (int j = 0; j < L; ++j) {
    if (j == lane) continue;
    post_recv(pending, comm, g, first + j, data.data() + lo(j), len(j), kGather);
    post_send(pending, comm, g, first + j, mine, m, kGather);
  }
  return wait_all(pending, at);
}

Status MpiCommunicator::hierarchical_reduce_scatter(std::span<const float> in, std::span<float> out,
                                                    const Group& g, ReduceOp op, MPI_Comm comm,
                                                    NodeBlocks nb, const std::string& at) {
  const int k = g.index_of(rank_), L = nb.per_node, N = nb.nodes;
  const int node = k / L, lane = k % L, first = node * L;
  const std::size_t m = out.size();
  const auto M = static_cast<std::size_t>(N) * m;  // a lane: the blocks of members b·L + lane
  auto block = [&](int b, int i) { return static_cast<std::size_t>(b * L + i) * m; };
  // 1. Every member of this node sends member `lane` its lane's N blocks;
  // slot j of scratch holds member j's, node by node.
  scratch_.resize(static_cast<std::size_t>(L) * M);
  std::vector<Pending> pending;
  for (int j = 0; j < L; ++j) {
    if (j == lane) continue;
    for (int b = 0; b < N; ++b) {
      post_recv(pending, comm, g, first + j, scratch_.data() + static_cast<std::size_t>(j) * M + static_cast<std::size_t>(b) * m, m, kLanes);
      post_send(pending, comm, g, first + j, in.data() + block(b, j), m, kLanes);
    }
  }
  MT_TRY(wait_all(pending, at));
  // The chain reads member j's lane at contributions[j], block b at b·m;
  // this member's own blocks are L blocks apart in `in`: copied together.
  std::vector<float> own(M);
  for (int b = 0; b < N; ++b) comm::copy_floats(own.data() + static_cast<std::size_t>(b) * m, in.data() + block(b, lane), m);
  std::vector<const float*> contributions;
  for (int j = 0; j < L; ++j)
    contributions.push_back(j == lane ? own.data() : scratch_.data() + static_cast<std::size_t>(j) * M);
  chain_.resize(M);
  MT_TRY(chain(contributions, M, chain_.data(), g, op, comm, nb, at));
  // 2. The last node sends each block of the lane to its owner.
  pending.clear();
  if (node == N - 1) {
    for (int b = 0; b < N - 1; ++b)
      post_send(pending, comm, g, b * L + lane, chain_.data() + static_cast<std::size_t>(b) * m, m, kResult);
    comm::copy_floats(out.data(), chain_.data() + static_cast<std::size_t>(N - 1) * m, m);
  } else {
    post_recv(pending, comm, g, (N - 1) * L + lane, out.data(), m, kResult);
  }
  return wait_all(pending, at);
}

Status MpiCommunicator::hierarchical_all_gather(std::span<const float> in, std::span<float> out,
                                                const Group& g, MPI_Comm comm, NodeBlocks nb,
                                                const std::string& at) {
  const int k = g.index_of(rank_), L = nb.per_node, N = nb.nodes;
  const int node = k / L, lane = k % L, first = node * L;
  const std::size_t n = in.size();
  auto block = [&](int b, int i) { return out.data() + static_cast<std::size_t>(b * L + i) * n; };
  // 1. Across nodes, among the members with this local index.
  std::vector<Pending> pending;
  for (int b = 0; b < N; ++b) {
    if (b == node) continue;
    post_recv(pending, comm, g, b * L + lane, block(b, lane), n, kLanes);
    post_send(pending, comm, g, b * L + lane, in.data(), n, kLanes);
  }
  comm::copy_floats(block(node, lane), in.data(), n);
  MT_TRY(wait_all(pending, at));
  // 2. Inside the node: the N blocks of each local index.
  pending.clear();
  for (int j = 0; j < L; ++j) {
    if (j == lane) continue;
    for (int b = 0; b < N; ++b) {
      post_recv(pending, comm, g, first + j, block(b, j), n, kGather);
      post_send(pending, comm, g, first + j, block(b, lane), n, kGather);
    }
  }
  return wait_all(pending, at);
}

}  // namespace meshtrain
