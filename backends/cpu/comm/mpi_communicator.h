// Ranks as MPI processes: the "mpi" communicator. One per process; global
// ranks are MPI_COMM_WORLD ranks.
//
// Collectives are built from non-blocking point-to-point messages, not from
// MPI's collectives, for two reasons: MPI_Allreduce may combine in any order,
// and a per-peer request is what lets a timeout name the peers that have not
// arrived. Reductions use the same ordered fold as the in-process communicator
// (comm::combine over contributions in ascending group order), so the two agree
// bit for bit:
//   all_reduce     member k receives block k of every contribution, folds
//                  them in group order and sends the result to every member
//                  (reduce-scatter then all-gather, 2(G-1)/G of the data per rank);
//   reduce_scatter member k receives block k of every input and folds it;
//   all_gather, broadcast, all_to_all  direct sends to each member;
//   barrier        an empty message between every pair of members.
//
// Hierarchical (groups that span nodes; core/node_layout.h says when): a
// group of N nodes × L members, each node's members contiguous in group order,
// cuts the buffer into L lanes; local member i owns lane i on its node.
//   all_reduce     1. inside each node, member i receives lane i of its node's
//                     members (a reduce-scatter's messages, not yet folded);
//                  2. across nodes, lane by lane, a chain in node order: node
//                     0 folds its members' lanes in group order and sends the
//                     partial sum to node 1's member i, which folds its own
//                     members into it, and so on (pipelined in segments of
//                     kChainSegment); the last node sends the result to member
//                     i of every other node;
//                  3. inside each node, an all-gather of the lanes.
//                  Every element is folded c0, c1, ..., c(G-1) in ascending
//                  group order, as the flat algorithm folds it: the same bits
//                  (for any thread count: a rank folds on its issuing thread).
//                  Off-node bytes: 2(N-1)·n/L per lane, 2(N-1)·n in all,
//                  against 2(N-1)·L·n flat (1/L); the last node sends N-1
//                  copies of its lanes, the others one.
//   reduce_scatter the same chain over the N blocks of each lane (the blocks
//                  of members with local index i), then the last node sends
//                  each block to its owner: off-node (N-1)(N+1)·m per lane
//                  (m = output size) against (N-1)·N·L·m flat per lane
//                  ((N+1)/(N·L)): the fold must end on the last node.
//   all_gather     across nodes between members of equal local index, then
//                  inside each node: off-node (N-1)·n per member, 1/L of flat.
// bytes_sent() counts what these really send, so for them it differs from the
// in-process communicator's count (communicator.h), which is always flat.
// Each group gets its own MPI communicator, made once per Group id (after a
// timed handshake among the members, so that creating it cannot hang) and
// cached. Point-to-point send/recv use a duplicate of MPI_COMM_WORLD of their
// own; a send copies the data and returns at once.
//
// Waiting polls MPI_Test until the deadline (MPI has no timed wait). On a
// timeout or an MPI error the call returns an Error naming the op, group and
// the peers whose messages are incomplete, cancels what it can, and the
// communicator is poisoned. The peers cannot be told: the program must then
// call abort_job (backends/comm/mpi_environment.h), which stops every rank.
// Until it does, sends that could not be cancelled may still read the
// caller's buffers.
#pragma once

#include <mpi.h>

#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/communicator.h"
#include "core/node_layout.h"

namespace meshtrain {

class MpiCommunicator final : public Communicator {
 public:
  // Needs an initialised MPI (MpiEnvironment). Collective over MPI_COMM_WORLD
  // (it duplicates it): every process creates its communicator at start-up.
  // `nodes`: the node id of every global rank; empty: MESHTRAIN_NODES
  // ("0,0,1,1", one id per rank: one machine standing for several nodes) if
  // set, else ranks with the same host name (MPI_Get_processor_name) share one.
  static Result<std::unique_ptr<MpiCommunicator>> create(CommOptions options = {},
                                                         std::vector<int> nodes = {});
  // Waits (up to the timeout) for buffered sends to leave, then frees the
  // communicators. Must run before MPI_Finalize.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view kind() const override { return "mpi"; }

  #include "backends/cpu/communicator_overrides.inc"

  // The node id of every global rank, as create() found them.
  const std::vector<int>& nodes() const { return node_of_; }
  // The part of bytes_sent() that went to ranks on other nodes.
  std::int64_t bytes_sent_off_node() const { return bytes_sent_off_node_; }
  // Elements per message of the hierarchical chain (pipelining across nodes).
  static constexpr std::size_t kChainSegment = std::size_t{1} << 16;

 private:
  // One outstanding message of the call in progress.
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = -1;              // global rank
    bool is_recv = false;
    std::size_t expected = 0;   // recv: elements the peer must send
    MPI_Datatype type = MPI_FLOAT;
  };
  struct BufferedSend {
    std::vector<float> data;  // owned copy; MPI reads it until the request completes
    MPI_Request request = MPI_REQUEST_NULL;
  };
  struct SubComm {
    std::vector<int> ranks;
    MPI_Comm comm = MPI_COMM_NULL;
  };

  explicit MpiCommunicator(CommOptions options) : options_(options) {}

  // Checks liveness, the group and that `largest` elements fit an MPI count;
  // returns the group's communicator.
  Result<MPI_Comm> begin(const Group& g, const std::string& where, std::string_view op,
                         std::size_t largest);
  // begin() for reduce_scatter and all_gather, `block` elements per member, after checking that
  // their `whole` (reduce_scatter's input, all_gather's output: `whole_name`) holds one block per member.
  Result<MPI_Comm> begin_blocks(const Group& g, const std::string& where, std::string_view op,
                                std::string_view whole_name, std::size_t whole, std::size_t block);
  // Post one message of a call on group communicator `comm`; `member` is a
  // group index.
  void post_recv(std::vector<Pending>& pending, MPI_Comm comm, const Group& g, int member,
                 float* buf, std::size_t n, int tag);
  void post_send(std::vector<Pending>& pending, MPI_Comm comm, const Group& g, int member,
                 const float* buf, std::size_t n, int tag);
  // Counts a message of `floats` to global rank `peer` (bytes_sent, and off node).
  void count_to(int peer, std::size_t floats);
  // "rank 0: all_reduce on group 3 (ranks [0, 2])": the prefix of every error.
  std::string where(std::string_view op, const Group& g) const;
  Result<MPI_Comm> sub_comm(const Group& g, const std::string& where);
  // Polls until every request completes or the deadline passes.
  Status wait_all(std::vector<Pending>& pending, const std::string& where);
  // Cancels (receives) or frees (sends) every request still open.
  static void cancel(std::vector<Pending>& pending);
  // g as nodes of equal, contiguous runs of members when a collective of
  // `bytes` runs hierarchically over it (core/node_layout.h); nullopt: flat.
  std::optional<NodeBlocks> hierarchy(const Group& g, double bytes) const;
  // The hierarchical algorithms (mpi_hierarchical.cc), after begin().
  Status hierarchical_all_reduce(std::span<float> data, const Group& g, ReduceOp op, MPI_Comm comm,
                                 NodeBlocks nb, const std::string& at);
  Status hierarchical_reduce_scatter(std::span<const float> in, std::span<float> out, const Group& g,
                                     ReduceOp op, MPI_Comm comm, NodeBlocks nb, const std::string& at);
  Status hierarchical_all_gather(std::span<const float> in, std::span<float> out, const Group& g,
                                 MPI_Comm comm, NodeBlocks nb, const std::string& at);
  // The chain across nodes: folds the first `length` elements of the L
  // local contributions (local member order) into acc once the previous
  // node's partial sums have arrived, and passes them on to the next node's
  // member of the same local index; segment by segment (kChainSegment).
  Status chain(const std::vector<const float*>& contributions, std::size_t length, float* acc,
               const Group& g, ReduceOp op, MPI_Comm comm, NodeBlocks nb, const std::string& at);
  void reap_sends();
  Error fail(Error e);
  Status check_alive(const std::string& where) const;
  // What send and recv of `count` elements check first (`at` names the
  // call): the communicator is alive, `peer` is a rank, `tag` and `count`
  // are within MPI's limits; a bad peer, tag or count poisons it.
  Status check_point_to_point(std::size_t count, int peer, int tag, const std::string& at);

  CommOptions options_;
  int rank_ = 0;
  int world_ = 1;
  int tag_ub_ = 32767;  // the standard's minimum until MPI tells us
  MPI_Comm p2p_ = MPI_COMM_NULL;     // send/recv
  MPI_Comm setup_ = MPI_COMM_NULL;   // handshakes before a group's communicator is made
  MPI_Comm parent_ = MPI_COMM_NULL;  // parent of the group communicators
  std::map<int, SubComm> groups_;    // by Group id
  std::list<BufferedSend> sends_;    // in flight; a list, so entries never move
  std::vector<float> scratch_;       // received contributions, reused across calls
  std::vector<float> chain_;         // the hierarchical chain's partial sums, reused
  std::vector<int> node_of_;         // node id by global rank
  std::int64_t bytes_sent_off_node_ = 0;
  std::optional<Error> failure_;     // set by the first failure: poisons every later call
};

}  // namespace meshtrain
