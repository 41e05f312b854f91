#include "backends/cpu/comm/mpi_communicator.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "backends/comm/mpi_environment.h"
#include "backends/cpu/comm/common.h"
#include "core/last_words.h"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

// Tags inside a group communicator: the two phases of an all-reduce differ so a
// reader of a trace can tell them apart; everything else uses kData.
constexpr int kData = 0, kReduced = 1;

std::uint64_t hash_ranks(const std::vector<int>& ranks) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int r : ranks) {
    h ^= static_cast<std::uint64_t>(r);
    h *= 1099511628211ull;
  }
  return h;
}

// The node of every rank: given, from MESHTRAIN_NODES, or by host name (the
// index of the first rank on the same host). Collective over `world_comm`.
Result<std::vector<int>> find_nodes(std::vector<int> given, int rank, int world, MPI_Comm world_comm) {
  if (given.empty())
    if (const char* v = std::getenv("MESHTRAIN_NODES")) {
      std::string_view rest(v);
      while (true) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        int id = -1;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (ec != std::errc() || end != item.data() + item.size() || id < 0)
          return make_error("MESHTRAIN_NODES='{}': '{}' is not a node id (an integer >= 0); give one per rank, "
                            "e.g. 0,0,1,1", v, item);
        given.push_back(id);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      if (static_cast<int>(given.size()) != world)
        return make_error("MESHTRAIN_NODES='{}' gives {} node ids for a world of {} ranks; give one per rank", v,
                          given.size(), world);
    }
  if (!given.empty()) {
    if (static_cast<int>(given.size()) != world)
      return make_error("rank {}: {} node ids given for a world of {} ranks", rank, given.size(), world);
    return given;
  }
  std::vector<char> names(static_cast<std::size_t>(world) * MPI_MAX_PROCESSOR_NAME, '\0');
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(mine, &length);
  if (int rc = MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                             MPI_CHAR, world_comm);
      rc != MPI_SUCCESS)
    return make_error("rank {}: exchanging host names failed: {}", rank, mpi_error_text(rc));
  std::vector<int> nodes(static_cast<std::size_t>(world));
  auto name = [&](int r) { return std::string_view(names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME); };
  for (int r = 0; r < world; ++r) {
    int first = 0;
    while (name(first) != name(r)) ++first;
    nodes[static_cast<std::size_t>(r)] = first;
  }
  return nodes;
}

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create(CommOptions options, std::vector<int> nodes) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised)
    return make_error("MpiCommunicator: MPI is not running; create an MpiEnvironment first");
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(options));
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->world_);
  for (MPI_Comm* comm : {&c->p2p_, &c->setup_, &c->parent_}) {
    if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, comm); rc != MPI_SUCCESS)
      return make_error("rank {}: MPI_Comm_dup failed: {}", c->rank_, mpi_error_text(rc));
    // Errors come back as codes we turn into Errors, instead of aborting inside MPI.
    MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
  }
  void* attr = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &found);
  if (found) c->tag_ub_ = *static_cast<int*>(attr);
  MT_ASSIGN(c->node_of_, find_nodes(std::move(nodes), c->rank_, c->world_, c->setup_));
  return c;
}

MpiCommunicator::~MpiCommunicator() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalised) return;
  if (!failure_) {
    const auto deadline = Clock::now() + options_.timeout;
    while (!sends_.empty() && Clock::now() < deadline) {
      reap_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  // Sends still in flight after a failure or the timeout: the job is being
  // aborted; freeing the request lets MPI drop it once it can.
  for (auto& s : sends_)
    if (s.request != MPI_REQUEST_NULL) MPI_Request_free(&s.request);
  for (auto& [id, sub] : groups_) MPI_Comm_free(&sub.comm);
  for (MPI_Comm* comm : {&p2p_, &setup_, &parent_})
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
}

Error MpiCommunicator::fail(Error e) {
  if (!failure_) failure_ = e;
  return e;
}

Status MpiCommunicator::check_alive(const std::string& where) const {
  if (!failure_) return ok_status();
  return make_error("{}: not run, an earlier failure poisoned the communicator: {}", where,
                    failure_->message());
}

Status MpiCommunicator::wait_all(std::vector<Pending>& pending, const std::string& where) {
  const auto deadline = Clock::now() + options_.timeout;
  // A signal that ends this rank while it waits names the peer it waited for (core/last_words.h).
  struct WaitNotice {
    ~WaitNotice() { last_words::set_waiting_for(-1); }
  } notice;
  std::string error;
  for (std::size_t polls = 0;; ++polls) {
    bool done = true;
    int waiting_for = -1;
    for (auto& p : pending) {
      if (p.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status st;
      if (int rc = MPI_Test(&p.request, &flag, &st); rc != MPI_SUCCESS) {
        error = fmt::format("{} from rank {}: {}", p.is_recv ? "receiving" : "sending to", p.peer,
                            mpi_error_text(rc));
        break;
      }
      if (!flag) {
        done = false;
        if (waiting_for < 0) waiting_for = p.peer;
        continue;
      }
      if (p.is_recv) {
        int count = 0;
        MPI_Get_count(&st, p.type, &count);
        if (static_cast<std::size_t>(count) != p.expected) {
          error = fmt::format("rank {} sent {} elements but this rank expects {}", p.peer, count,
                              p.expected);
          break;
        }
      }
    }
    if (done && error.empty()) return ok_status();
    last_words::set_waiting_for(waiting_for);
    if (error.empty() && Clock::now() > deadline) {
      std::vector<int> peers;
      for (auto& p : pending)
        if (p.request != MPI_REQUEST_NULL) peers.push_back(p.peer);
      std::sort(peers.begin(), peers.end());
      peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
      error = fmt::format("timed out after {} ms; still waiting for {}", options_.timeout.count(),
                          comm::describe_ranks(peers));
    }
    if (!error.empty()) break;
    // MPI only progresses inside MPI calls, so we poll; backing off keeps an
    // oversubscribed node (more ranks than cores) from starving the peers.
    if (polls < 64) continue;
    if (polls < 1024) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  cancel(pending);
  return fail(make_error("{}: {}", where, error));
}

void MpiCommunicator::cancel(std::vector<Pending>& pending) {
  // Receives cancel locally, so waiting for them is safe and guarantees MPI no
  // longer writes into the caller's buffers. Open MPI cannot cancel a send that
  // is already under way: free it and let the abort end it.
  for (auto& p : pending) {
    if (p.request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&p.request);
    if (p.is_recv) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    else MPI_Request_free(&p.request);
  }
}

std::optional<NodeBlocks> MpiCommunicator::hierarchy(const Group& g, double bytes) const {
  std::vector<int> member_nodes;
  for (int r : g.ranks) member_nodes.push_back(node_of_[static_cast<std::size_t>(r)]);
  if (!use_hierarchical(member_nodes, bytes)) return std::nullopt;
  return node_blocks(member_nodes);
}

Result<MPI_Comm> MpiCommunicator::sub_comm(const Group& g, const std::string& where) {
  if (auto it = groups_.find(g.id); it != groups_.end()) {
    if (it->second.ranks != g.ranks)
      return fail(make_error("{}: group id {} is already used for {}", where, g.id,
                             comm::describe(Group{g.id, it->second.ranks})));
    return it->second.comm;
  }
  if (g.id < 0 || g.id > tag_ub_)
    return fail(make_error("{}: group id {} is outside the MPI tag range [0, {}]", where, g.id, tag_ub_));
  // Every member tells every other that it is here and which member list it
  // has; only then is the (untimed) MPI_Comm_create_group sure to finish.
  const int me = g.index_of(rank_);
  const std::array<std::uint64_t, 2> mine{static_cast<std::uint64_t>(g.size()), hash_ranks(g.ranks)};
  std::vector<std::array<std::uint64_t, 2>> theirs(g.ranks.size());
  std::vector<Pending> pending;
  for (int j = 0; j < g.size(); ++j) {
    if (j == me) continue;
    const int peer = g.ranks[static_cast<std::size_t>(j)];
    Pending& r = pending.emplace_back(Pending{MPI_REQUEST_NULL, peer, true, 2, MPI_UINT64_T});
    MPI_Irecv(theirs[static_cast<std::size_t>(j)].data(), 2, MPI_UINT64_T, peer, g.id, setup_, &r.request);
    Pending& s = pending.emplace_back(Pending{MPI_REQUEST_NULL, peer, false, 0, MPI_UINT64_T});
    MPI_Isend(mine.data(), 2, MPI_UINT64_T, peer, g.id, setup_, &s.request);
  }
  MT_TRY(wait_all(pending, where + " (creating the group)"));
  for (int j = 0; j < g.size(); ++j)
    if (j != me && theirs[static_cast<std::size_t>(j)] != mine)
      return fail(make_error("{}: rank {} uses group id {} for a different member list", where,
                             g.ranks[static_cast<std::size_t>(j)], g.id));
  MPI_Group world_group, members;
  MPI_Comm_group(parent_, &world_group);
  MPI_Group_incl(world_group, g.size(), g.ranks.data(), &members);
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(parent_, members, g.id, &comm);
  MPI_Group_free(&members);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS)
    return fail(make_error("{}: MPI_Comm_create_group failed: {}", where, mpi_error_text(rc)));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  groups_.emplace(g.id, SubComm{g.ranks, comm});
  return comm;
}

Result<MPI_Comm> MpiCommunicator::begin(const Group& g, const std::string& where,
                                        std::string_view op, std::size_t largest) {
  MT_TRY(check_alive(where));
  if (auto s = comm::check_group(g, rank_, world_, op); !s.ok())
    return fail(Error(fmt::format("rank {}: {}", rank_, s.error().message())));
  if (largest > static_cast<std::size_t>(INT_MAX))
    return fail(make_error("{}: {} elements exceed the MPI count limit of {}", where, largest, INT_MAX));
  return sub_comm(g, where);
}

Result<MPI_Comm> MpiCommunicator::begin_blocks(const Group& g, const std::string& where, std::string_view op,
                                              std::string_view whole_name, std::size_t whole, std::size_t block) {
  MT_ASSIGN(MPI_Comm comm, begin(g, where, op, block));
  const auto G = static_cast<std::size_t>(g.size());
  if (whole != block * G)
    return fail(make_error("{}: {} has {} elements, expected {} ({} blocks of {})", where, whole_name, whole,
                           block * G, G, block));
  return comm;
}

void MpiCommunicator::post_recv(std::vector<Pending>& pending, MPI_Comm comm, const Group& g,
                                int member, float* buf, std::size_t n, int tag) {
  Pending& p = pending.emplace_back();
  p.peer = g.ranks[static_cast<std::size_t>(member)];
  p.is_recv = true;
  p.expected = n;
  MPI_Irecv(buf, static_cast<int>(n), MPI_FLOAT, member, tag, comm, &p.request);
}

void MpiCommunicator::post_send(std::vector<Pending>& pending, MPI_Comm comm, const Group& g,
                                int member, const float* buf, std::size_t n, int tag) {
  Pending& p = pending.emplace_back();
  p.peer = g.ranks[static_cast<std::size_t>(member)];
  count_to(p.peer, n);
  MPI_Isend(buf, static_cast<int>(n), MPI_FLOAT, member, tag, comm, &p.request);
}

void MpiCommunicator::count_to(int peer, std::size_t floats) {
  count_sent(floats);
  if (node_of_[static_cast<std::size_t>(peer)] != node_of_[static_cast<std::size_t>(rank_)])
    bytes_sent_off_node_ += static_cast<std::int64_t>(floats * sizeof(float));
}

std::string MpiCommunicator::where(std::string_view op, const Group& g) const {
  return fmt::format("rank {}: {} on {}", rank_, op, comm::describe(g));
}

Status MpiCommunicator::all_reduce(std::span<float> data, const Group& g, ReduceOp op) {
  const std::string at = where("all_reduce", g);
  MT_ASSIGN(MPI_Comm comm, begin(g, at, "all_reduce", data.size()));
  if (auto nb = hierarchy(g, static_cast<double>(data.size_bytes())))
    return hierarchical_all_reduce(data, g, op, comm, *nb, at);
  const auto G = static_cast<std::size_t>(g.size());
  const auto k = static_cast<std::size_t>(g.index_of(rank_));
  const std::size_t n = data.size();
  auto lo = [&](std::size_t j) { return n * j / G; };
  auto len = [&](std::size_t j) { return lo(j + 1) - lo(j); };
  // Slot j of scratch receives member j's block k; slot k accumulates.
  const std::size_t block = len(k);
  scratch_.resize(G * block);
  std::vector<Pending> pending;
  for (std::size_t j = 0; j < G; ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, static_cast<int>(j), scratch_.data() + j * block, block, kData);
    post_send(pending, comm, g, static_cast<int>(j), data.data() + lo(j), len(j), kData);
  }
  MT_TRY(wait_all(pending, at));
  auto contribution = [&](std::size_t j) { return j == k ? data.data() + lo(k) : scratch_.data() + j * block; };
  float* acc = scratch_.data() + k * block;
  comm::copy_floats(acc, contribution(0), block);
  for (std::size_t j = 1; j < G; ++j) comm::combine(acc, contribution(j), block, op);
  comm::copy_floats(data.data() + lo(k), acc, block);
  // Every phase-one send from `data` has completed, so its blocks may now be overwritten.
  pending.clear();
  for (std::size_t j = 0; j < G; ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, static_cast<int>(j), data.data() + lo(j), len(j), kReduced);
    post_send(pending, comm, g, static_cast<int>(j), data.data() + lo(k), block, kReduced);
  }
  return wait_all(pending, at);
}

Status MpiCommunicator::reduce_scatter(std::span<const float> in, std::span<float> out,
                                       const Group& g, ReduceOp op) {
  const std::string at = where("reduce_scatter", g);
  MT_ASSIGN(MPI_Comm comm, begin_blocks(g, at, "reduce_scatter", "input", in.size(), out.size()));
  if (auto nb = hierarchy(g, static_cast<double>(in.size_bytes())))
    return hierarchical_reduce_scatter(in, out, g, op, comm, *nb, at);
  const auto G = static_cast<std::size_t>(g.size());
  const auto k = static_cast<std::size_t>(g.index_of(rank_));
  const std::size_t n = out.size();
  scratch_.resize(G * n);
  std::vector<Pending> pending;
  for (std::size_t j = 0; j < G; ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, static_cast<int>(j), scratch_.data() + j * n, n, kData);
    post_send(pending, comm, g, static_cast<int>(j), in.data() + j * n, n, kData);
  }
  MT_TRY(wait_all(pending, at));
  auto contribution = [&](std::size_t j) { return j == k ? in.data() + k * n : scratch_.data() + j * n; };
  comm::copy_floats(out.data(), contribution(0), n);
  for (std::size_t j = 1; j < G; ++j) comm::combine(out.data(), contribution(j), n, op);
  return ok_status();
}

Status MpiCommunicator::all_gather(std::span<const float> in, std::span<float> out, const Group& g) {
  const std::string at = where("all_gather", g);
  MT_ASSIGN(MPI_Comm comm, begin_blocks(g, at, "all_gather", "output", out.size(), in.size()));
  if (auto nb = hierarchy(g, static_cast<double>(out.size_bytes())))
    return hierarchical_all_gather(in, out, g, comm, *nb, at);
  const auto G = static_cast<std::size_t>(g.size());
  const auto k = static_cast<std::size_t>(g.index_of(rank_));
  const std::size_t n = in.size();
  std::vector<Pending> pending;
  for (std::size_t j = 0; j < G; ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, static_cast<int>(j), out.data() + j * n, n, kData);
    post_send(pending, comm, g, static_cast<int>(j), in.data(), n, kData);
  }
  comm::copy_floats(out.data() + k * n, in.data(), n);
  return wait_all(pending, at);
}

Status MpiCommunicator::broadcast(std::span<float> data, const Group& g, int root_global_rank) {
  const std::string at = where("broadcast", g);
  MT_ASSIGN(MPI_Comm comm, begin(g, at, "broadcast", data.size()));
  const int root = g.index_of(root_global_rank);
  if (root < 0)
    return fail(make_error("{}: root rank {} is not a member", at, root_global_rank));
  const int k = g.index_of(rank_);
  std::vector<Pending> pending;
  if (k == root) {
    for (int j = 0; j < g.size(); ++j)
      if (j != k) post_send(pending, comm, g, j, data.data(), data.size(), kData);
  } else {
    post_recv(pending, comm, g, root, data.data(), data.size(), kData);
  }
  return wait_all(pending, at);
}

Status MpiCommunicator::all_to_all(std::span<const float> in,
                                   std::span<const std::int64_t> send_counts, std::span<float> out,
                                   std::span<const std::int64_t> recv_counts, const Group& g) {
  const std::string at = where("all_to_all", g);
  MT_ASSIGN(MPI_Comm comm, begin(g, at, "all_to_all", std::max(in.size(), out.size())));
  const auto k = static_cast<std::size_t>(g.index_of(rank_));
  auto sends = comm::block_offsets(send_counts, in.size(), g.size(), "send_counts");
  if (!sends.ok()) return fail(make_error("{}: {}", at, sends.error().message()));
  auto recvs = comm::block_offsets(recv_counts, out.size(), g.size(), "recv_counts");
  if (!recvs.ok()) return fail(make_error("{}: {}", at, recvs.error().message()));
  if (send_counts[k] != recv_counts[k])
    return fail(make_error("{}: rank {} sends {} elements to itself but expects {}", at, rank_,
                           send_counts[k], recv_counts[k]));
  std::vector<Pending> pending;
  for (std::size_t j = 0; j < g.ranks.size(); ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, static_cast<int>(j), out.data() + (*recvs)[j],
              static_cast<std::size_t>(recv_counts[j]), kData);
    post_send(pending, comm, g, static_cast<int>(j), in.data() + (*sends)[j],
              static_cast<std::size_t>(send_counts[j]), kData);
  }
  comm::copy_floats(out.data() + (*recvs)[k], in.data() + (*sends)[k], static_cast<std::size_t>(recv_counts[k]));
  return wait_all(pending, at);
}

Status MpiCommunicator::barrier(const Group& g) {
  const std::string at = where("barrier", g);
  MT_ASSIGN(MPI_Comm comm, begin(g, at, "barrier", 0));
  const int k = g.index_of(rank_);
  std::vector<Pending> pending;
  for (int j = 0; j < g.size(); ++j) {
    if (j == k) continue;
    post_recv(pending, comm, g, j, nullptr, 0, kData);
    post_send(pending, comm, g, j, nullptr, 0, kData);
  }
  return wait_all(pending, at);
}

void MpiCommunicator::reap_sends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int flag = 0;
    MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE);
    it = flag ? sends_.erase(it) : std::next(it);
  }
}

Status MpiCommunicator::check_point_to_point(std::size_t count, int peer, int tag,
                                             const std::string& at) {
  MT_TRY(check_alive(at));
  if (peer < 0 || peer >= world_)
    return fail(make_error("{}: no such rank in a world of {}", at, world_));
  if (tag < 0 || tag > tag_ub_)
    return fail(make_error("{}: tag is outside the MPI tag range [0, {}]", at, tag_ub_));
  if (count > static_cast<std::size_t>(INT_MAX))
    return fail(make_error("{}: {} elements exceed the MPI count limit of {}", at, count, INT_MAX));
  return ok_status();
}

Status MpiCommunicator::send(std::span<const float> data, int peer, int tag) {
  const std::string at = fmt::format("rank {}: send to rank {} (tag {})", rank_, peer, tag);
  MT_TRY(check_point_to_point(data.size(), peer, tag, at));
  reap_sends();
  BufferedSend& s = sends_.emplace_back();
  s.data.assign(data.begin(), data.end());
  if (int rc = MPI_Isend(s.data.data(), static_cast<int>(s.data.size()), MPI_FLOAT, peer, tag, p2p_,
                         &s.request);
      rc != MPI_SUCCESS) {
    sends_.pop_back();
    return fail(make_error("{}: {}", at, mpi_error_text(rc)));
  }
  count_to(peer, data.size());
  return ok_status();
}

Status MpiCommunicator::recv(std::span<float> data, int peer, int tag) {
  const std::string at = fmt::format("rank {}: recv from rank {} (tag {})", rank_, peer, tag);
  MT_TRY(check_point_to_point(data.size(), peer, tag, at));
  reap_sends();
  std::vector<Pending> pending(1);
  pending[0].peer = peer;
  pending[0].is_recv = true;
  pending[0].expected = data.size();
  MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_FLOAT, peer, tag, p2p_, &pending[0].request);
  return wait_all(pending, at);
}

}  // namespace meshtrain
