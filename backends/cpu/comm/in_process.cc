#include "backends/cpu/comm/in_process.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <thread>

#include "backends/cpu/comm/common.h"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

enum class Kind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, barrier };

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::all_gather: return "all_gather";
    case Kind::broadcast: return "broadcast";
    case Kind::all_to_all: return "all_to_all";
    case Kind::barrier: return "barrier";
  }
  return "?";
}

// Elements folded at a time: the tile stays in L1 while G contributions pass over it.
constexpr std::size_t kTile = 2048;

}  // namespace

// One member's part of a collective: what it posted. Lives on the poster's
// stack; valid until the collective completes on the whole group.
struct InProcessHub::Call {
  Kind kind = Kind::barrier;
  ReduceOp op = ReduceOp::sum;
  const float* in = nullptr;
  std::size_t in_n = 0;
  float* out = nullptr;
  std::size_t out_n = 0;
  int root = -1;                       // broadcast: global rank of the root
  std::span<const std::int64_t> send_counts;  // all_to_all, by member
  std::span<const std::int64_t> recv_counts;
  std::vector<std::size_t> send_offsets;      // all_to_all: prefix sums of the counts
  std::vector<std::size_t> recv_offsets;

  // A call of `kind` reading `in` and writing `out` (the same buffer for the in-place ones).
  static Call over(Kind kind, std::span<const float> in, std::span<float> out) {
    Call call;
    call.kind = kind;
    call.in = in.data();
    call.in_n = in.size();
    call.out = out.data();
    call.out_n = out.size();
    return call;
  }
};

// The collective being assembled on one group. Collective number `completed+1`
// is in progress: members post, wait until all have arrived, do their share,
// then wait until all have departed, and the last to depart opens the next one.
struct InProcessHub::GroupState {
  explicit GroupState(std::vector<int> r)
      : ranks(std::move(r)), posted(ranks.size(), 0), calls(ranks.size(), nullptr) {}
  const std::vector<int> ranks;  // fixed at creation, read without the lock

  std::mutex mu;  // guards every field below
  std::condition_variable cv;
  std::uint64_t completed = 0;  // collectives every member has finished
  int arrived = 0;              // members posted for collective completed+1
  int departed = 0;             // members done with collective completed+1
  std::vector<std::uint64_t> posted;  // by member: the collective it last posted for (0: none)
  std::vector<const Call*> calls;     // by member: its post, valid while posted == completed+1
  // Copies of `arrived` and `completed`, stored under `mu` with them, that a
  // waiter polls without the lock before it sleeps (poll_briefly).
  std::atomic<int> arrived_now{0};
  std::atomic<std::uint64_t> completed_now{0};
};

namespace {

// A waiting member polls for a short while before it sleeps on the condition
// variable: a futex sleep and wake-up costs 20-100 µs on these VMs, more than
// a small collective's data movement, and inside a step the peers usually
// arrive within that window (a tp2 all-reduce of 128 KiB took 140 µs in a step
// against 50 µs back to back; RESULTS.md, issue 7). The caller re-checks its
// predicate under the lock afterwards, so polling changes latency only.
constexpr auto kPoll = std::chrono::microseconds(50);
template <class Ready>
void poll_briefly(Ready ready) {
  const auto until = Clock::now() + kPoll;
  while (!ready() && Clock::now() < until) std::this_thread::yield();
}

}  // namespace

// Messages addressed to one rank.
struct InProcessHub::Mailbox {
  std::mutex mu;  // guards queues
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> queues;  // (source, tag) -> in send order
};

InProcessHub::InProcessHub(int world_size, CommOptions options)
    : world_(world_size), options_(options), exited_(new std::atomic<bool>[world_size]) {
  for (int r = 0; r < world_; ++r) {
    exited_[static_cast<std::size_t>(r)] = false;
    mailboxes_.push_back(std::make_unique<Mailbox>());
  }
}

InProcessHub::~InProcessHub() = default;

void InProcessHub::record_failure(const Error& error) {
  std::lock_guard lock(failure_mu_);
  if (!failure_) failure_ = error;
  poisoned_.store(true, std::memory_order_release);
}

void InProcessHub::poison(const Error& error) {
  record_failure(error);
  wake_all();
}

std::optional<Error> InProcessHub::failure() const {
  std::lock_guard lock(failure_mu_);
  return failure_;
}

void InProcessHub::mark_exited(int rank) {
  exited_[static_cast<std::size_t>(rank)] = true;
  wake_all();
}

void InProcessHub::wake_all() {
  // Taking each waiter's mutex before notifying means a waiter is either
  // before its predicate check (and will see the new state) or inside wait().
  std::lock_guard groups_lock(groups_mu_);
  for (auto& [id, gs] : groups_) {
    { std::lock_guard lock(gs->mu); }
    gs->cv.notify_all();
  }
  for (auto& mb : mailboxes_) {
    { std::lock_guard lock(mb->mu); }
    mb->cv.notify_all();
  }
}

Result<InProcessHub::GroupState*> InProcessHub::group_state(const Group& g, std::string_view op) {
  std::lock_guard lock(groups_mu_);
  auto it = groups_.find(g.id);
  if (it == groups_.end()) it = groups_.emplace(g.id, std::make_unique<GroupState>(g.ranks)).first;
  if (it->second->ranks != g.ranks)
    return make_error("{} on {}: group id {} is already used for {}", op, comm::describe(g), g.id,
                      comm::describe(Group{g.id, it->second->ranks}));
  return it->second.get();
}

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<InProcessHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

// Takes this member's post back, so that no peer can see a complete group
// that includes buffers of a rank that has returned.
void InProcessCommunicator::withdraw_locked(InProcessHub::GroupState& gs, std::size_t member) {
  gs.posted[member] = 0;
  gs.calls[member] = nullptr;
  gs.arrived_now.store(--gs.arrived, std::memory_order_release);
}

Error InProcessCommunicator::fail(Error e) {
  hub_->poison(e);
  return e;
}

Status InProcessCommunicator::check_alive(std::string_view what) {
  if (!hub_->poisoned()) return ok_status();
  return make_error("rank {}: {}: not run, an earlier failure poisoned the communicator: {}", rank_,
                    what, hub_->failure()->message());
}

// Whether every member posted the same collective: a pure function of all
// posts, so every member reaches the same verdict and none touches a peer's
// buffers when the posts disagree. Empty when they agree.
std::string InProcessCommunicator::posts_mismatch(const Group& g, const std::vector<const InProcessHub::Call*>& calls) {
  const int G = g.size();
  std::string mismatch;
  const auto& c0 = *calls[0];
  for (int j = 1; j < G && mismatch.empty(); ++j) {
    const auto& cj = *calls[static_cast<std::size_t>(j)];
    const int r0 = g.ranks[0], rj = g.ranks[static_cast<std::size_t>(j)];
    if (cj.kind != c0.kind)
      mismatch = fmt::format("rank {} called {} but rank {} called {}", r0, kind_name(c0.kind), rj,
                             kind_name(cj.kind));
    else if ((c0.kind == Kind::all_reduce || c0.kind == Kind::reduce_scatter) && cj.op != c0.op)
      mismatch = fmt::format("rank {} reduces by {} but rank {} by {}", r0,
                             comm::reduce_op_name(c0.op), rj, comm::reduce_op_name(cj.op));
    else if (c0.kind != Kind::all_to_all && (cj.in_n != c0.in_n || cj.out_n != c0.out_n))
      mismatch = fmt::format("rank {} passed {} -> {} elements but rank {} passed {} -> {}", r0,
                             c0.in_n, c0.out_n, rj, cj.in_n, cj.out_n);
    else if (c0.kind == Kind::broadcast && cj.root != c0.root)
      mismatch = fmt::format("rank {} broadcasts from rank {} but rank {} from rank {}", r0, c0.root,
                             rj, cj.root);
  }
  if (mismatch.empty() && c0.kind == Kind::all_to_all) {
    for (int j = 0; j < G && mismatch.empty(); ++j)
      for (int k = 0; k < G && mismatch.empty(); ++k) {
        auto sent = calls[static_cast<std::size_t>(j)]->send_counts[static_cast<std::size_t>(k)];
        auto expected = calls[static_cast<std::size_t>(k)]->recv_counts[static_cast<std::size_t>(j)];
        if (sent != expected)
          mismatch = fmt::format("rank {} sends {} elements to rank {}, which expects {}",
                                 g.ranks[static_cast<std::size_t>(j)], sent,
                                 g.ranks[static_cast<std::size_t>(k)], expected);
      }
  }
  return mismatch;
}

// Member `k`'s share of the data movement of a collective whose posts agree:
// each member writes only its own block (all_reduce) or its own output, so
// the members' shares run at once without locks.
void InProcessCommunicator::move_share(const Group& g, const InProcessHub::Call& call,
                                      const std::vector<const InProcessHub::Call*>& calls, std::size_t k) {
  const auto uG = static_cast<std::size_t>(g.size());
  switch (call.kind) {
    case Kind::all_reduce: {
      // Block k of the reduction: fold every member's block k in group
      // order, then store it into every member's buffer. Only this member
      // touches block k of any buffer.
      const std::size_t n = call.out_n, lo = n * k / uG, hi = n * (k + 1) / uG;
      float tile[kTile];
      for (std::size_t b = lo; b < hi; b += kTile) {
        const std::size_t len = std::min(kTile, hi - b);
        comm::copy_floats(tile, calls[0]->out + b, len);
        for (std::size_t j = 1; j < uG; ++j) comm::combine(tile, calls[j]->out + b, len, call.op);
        for (std::size_t j = 0; j < uG; ++j) comm::copy_floats(calls[j]->out + b, tile, len);
      }
      break;
    }
    case Kind::reduce_scatter: {
      const std::size_t n = call.out_n;
      for (std::size_t b = 0; b < n; b += kTile) {
        const std::size_t len = std::min(kTile, n - b);
        comm::copy_floats(call.out + b, calls[0]->in + k * n + b, len);
        for (std::size_t j = 1; j < uG; ++j)
          comm::combine(call.out + b, calls[j]->in + k * n + b, len, call.op);
      }
      break;
    }
    case Kind::all_gather:
      for (std::size_t j = 0; j < uG; ++j) comm::copy_floats(call.out + j * call.in_n, calls[j]->in, call.in_n);
      break;
    case Kind::broadcast: {
      const auto root = static_cast<std::size_t>(g.index_of(call.root));
      if (root != k) comm::copy_floats(call.out, calls[root]->out, call.out_n);
      break;
    }
    case Kind::all_to_all:
      for (std::size_t j = 0; j < uG; ++j)
        comm::copy_floats(call.out + call.recv_offsets[j], calls[j]->in + calls[j]->send_offsets[k],
                    static_cast<std::size_t>(call.recv_counts[j]));
      break;
    case Kind::barrier: break;
  }
}

// Posts this member's call as the group's next collective (its number into
// `seq`, read under the same lock as the post) and waits until every member
// has posted (or a member exited, the hub was poisoned, or the timeout
// passed: then this member withdraws and the cause is returned).
Result<std::vector<const InProcessHub::Call*>> InProcessCommunicator::arrive(
    InProcessHub::GroupState& gs, std::size_t me, InProcessHub::Call& call, const std::string& where,
    std::uint64_t& seq) {
  const int G = static_cast<int>(gs.ranks.size());
  const auto deadline = Clock::now() + hub_->options().timeout;
  std::unique_lock lock(gs.mu);
  seq = gs.completed + 1;
  gs.posted[me] = seq;
  gs.calls[me] = &call;
  gs.arrived_now.store(++gs.arrived, std::memory_order_release);
  if (gs.arrived == G) {
    gs.cv.notify_all();
  } else {
    lock.unlock();
    poll_briefly([&] {
      return gs.arrived_now.load(std::memory_order_acquire) == G || hub_->poisoned();
    });
    lock.lock();
  }
  auto missing = [&] {
    std::vector<int> m;
    for (std::size_t i = 0; i < gs.ranks.size(); ++i)
      if (gs.posted[i] != seq) m.push_back(gs.ranks[i]);
    return m;
  };
  auto missing_exited = [&] {
    std::vector<int> m;
    for (std::size_t i = 0; i < gs.ranks.size(); ++i)
      if (gs.posted[i] != seq && hub_->exited(gs.ranks[i])) m.push_back(gs.ranks[i]);
    return m;
  };
  gs.cv.wait_until(lock, deadline, [&] {
    return gs.arrived == G || hub_->poisoned() || !missing_exited().empty();
  });
  if (gs.arrived != G) {
    if (hub_->poisoned()) {
      withdraw_locked(gs, me);
      lock.unlock();
      return make_error("{}: aborted, another rank failed: {}", where, hub_->failure()->message());
    }
    // The failure is recorded before this rank withdraws, under the group's
    // lock, so a peer timing out at the same moment reads it as the cause
    // instead of naming this rank as missing.
    const std::vector<int> gone = missing_exited();
    Error e = !gone.empty()
                  ? make_error("{}: {} returned without joining it", where, comm::describe_ranks(gone))
                  : make_error("{}: timed out after {} ms; still waiting for {}", where,
                               hub_->options().timeout.count(), comm::describe_ranks(missing()));
    hub_->record_failure(e);
    withdraw_locked(gs, me);
    lock.unlock();
    hub_->wake_all();
    return e;
  }
  return gs.calls;
}

// Waits until every member has done its share; the last to depart opens
// collective `seq + 1`. No timeout and no poison check here: every member
// has arrived, and what is left of its share is local copying that cannot
// block, so this wait ends soon; returning earlier would let the caller free
// buffers a peer is still reading or writing.
void InProcessCommunicator::depart(InProcessHub::GroupState& gs, std::uint64_t seq) {
  const int G = static_cast<int>(gs.ranks.size());
  std::unique_lock lock(gs.mu);
  if (++gs.departed == G) {
    gs.arrived = 0;
    gs.departed = 0;
    gs.completed = seq;
    gs.arrived_now.store(0, std::memory_order_release);
    gs.completed_now.store(seq, std::memory_order_release);
    gs.cv.notify_all();
  } else {
    lock.unlock();
    poll_briefly([&] { return gs.completed_now.load(std::memory_order_acquire) >= seq; });
    lock.lock();
    gs.cv.wait(lock, [&] { return gs.completed >= seq; });
  }
  lock.unlock();
}

Status InProcessCommunicator::collective(const Group& g, InProcessHub::Call& call) {
  const std::string_view op = kind_name(call.kind);
  const std::string where = fmt::format("rank {}: {} on {}", rank_, op, comm::describe(g));
  MT_TRY(check_alive(fmt::format("{} on {}", op, comm::describe(g))));
  if (auto s = comm::check_group(g, rank_, world_size(), op); !s.ok())
    return fail(Error(fmt::format("rank {}: {}", rank_, s.error().message())));
  MT_ASSIGN(InProcessHub::GroupState* gs, group_state(g, op));
  const auto me = static_cast<std::size_t>(g.index_of(rank_));
  std::uint64_t seq = 0;  // this collective's number on the group, set by arrive
  MT_ASSIGN(const std::vector<const InProcessHub::Call*> calls, arrive(*gs, me, call, where, seq));
  const std::string mismatch = posts_mismatch(g, calls);
  if (mismatch.empty()) move_share(g, call, calls, me);
  depart(*gs, seq);
  if (!mismatch.empty()) return fail(make_error("{}: members disagree: {}", where, mismatch));
  return ok_status();
}

// This rank's state of group g, looked up in the hub once per group.
Result<InProcessHub::GroupState*> InProcessCommunicator::group_state(const Group& g, std::string_view op) {
  if (auto it = groups_.find(g.id); it != groups_.end() && it->second->ranks == g.ranks) return it->second;
  auto found = hub_->group_state(g, op);
  if (!found.ok()) return fail(Error(fmt::format("rank {}: {}", rank_, found.error().message())));
  groups_[g.id] = *found;
  return *found;
}

Status InProcessCommunicator::all_reduce(std::span<float> data, const Group& g, ReduceOp op) {
  auto call = InProcessHub::Call::over(Kind::all_reduce, data, data);
  call.op = op;
  // As the MPI communicator: blocks n·j/G to their owners, then the own reduced block to the others.
  const auto G = static_cast<std::size_t>(g.size()), k = static_cast<std::size_t>(std::max(0, g.index_of(rank_)));
  const std::size_t own = data.size() * (k + 1) / G - data.size() * k / G;
  count_sent(data.size() - own + (G - 1) * own);
  return collective(g, call);
}

Status InProcessCommunicator::reduce_scatter(std::span<const float> in, std::span<float> out,
                                             const Group& g, ReduceOp op) {
  if (in.size() != out.size() * static_cast<std::size_t>(g.size()))
    return fail(make_error("rank {}: reduce_scatter on {}: input has {} elements, expected {} ({} blocks of {})",
                           rank_, comm::describe(g), in.size(), out.size() * g.ranks.size(),
                           g.size(), out.size()));
  auto call = InProcessHub::Call::over(Kind::reduce_scatter, in, out);
  call.op = op;
  count_sent((g.ranks.size() - 1) * out.size());
  return collective(g, call);
}

Status InProcessCommunicator::all_gather(std::span<const float> in, std::span<float> out,
                                         const Group& g) {
  if (out.size() != in.size() * static_cast<std::size_t>(g.size()))
    return fail(make_error("rank {}: all_gather on {}: output has {} elements, expected {} ({} blocks of {})",
                           rank_, comm::describe(g), out.size(), in.size() * g.ranks.size(),
                           g.size(), in.size()));
  auto call = InProcessHub::Call::over(Kind::all_gather, in, out);
  count_sent((g.ranks.size() - 1) * in.size());
  return collective(g, call);
}

Status InProcessCommunicator::broadcast(std::span<float> data, const Group& g, int root_global_rank) {
  if (g.index_of(root_global_rank) < 0)
    return fail(make_error("rank {}: broadcast on {}: root rank {} is not a member", rank_,
                           comm::describe(g), root_global_rank));
  auto call = InProcessHub::Call::over(Kind::broadcast, data, data);
  call.root = root_global_rank;
  if (root_global_rank == rank_) count_sent((g.ranks.size() - 1) * data.size());
  return collective(g, call);
}

Status InProcessCommunicator::all_to_all(std::span<const float> in,
                                         std::span<const std::int64_t> send_counts,
                                         std::span<float> out,
                                         std::span<const std::int64_t> recv_counts,
                                         const Group& g) {
  auto call = InProcessHub::Call::over(Kind::all_to_all, in, out);
  auto sends = comm::block_offsets(send_counts, in.size(), g.size(), "send_counts");
  auto recvs = comm::block_offsets(recv_counts, out.size(), g.size(), "recv_counts");
  for (auto* r : {&sends, &recvs})
    if (!r->ok())
      return fail(make_error("rank {}: all_to_all on {}: {}", rank_, comm::describe(g),
                             r->error().message()));
  call.send_offsets = std::move(sends).value();
  call.recv_offsets = std::move(recvs).value();
  call.send_counts = send_counts;
  call.recv_counts = recv_counts;
  const int self = g.index_of(rank_);
  for (int j = 0; j < g.size(); ++j)
    if (j != self) count_sent(static_cast<std::size_t>(send_counts[static_cast<std::size_t>(j)]));
  return collective(g, call);
}

Status InProcessCommunicator::barrier(const Group& g) {
  InProcessHub::Call call;
  call.kind = Kind::barrier;
  return collective(g, call);
}

Status InProcessCommunicator::send(std::span<const float> data, int peer, int tag) {
  MT_TRY(check_alive(fmt::format("send to rank {} (tag {})", peer, tag)));
  if (peer < 0 || peer >= world_size())
    return fail(make_error("rank {}: send to rank {} (tag {}): no such rank in a world of {}", rank_,
                           peer, tag, world_size()));
  std::vector<float> message(data.begin(), data.end());
  auto& mb = *hub_->mailboxes_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard lock(mb.mu);
    mb.queues[{rank_, tag}].push_back(std::move(message));
  }
  count_sent(data.size());
  mb.cv.notify_all();
  return ok_status();
}

Status InProcessCommunicator::recv(std::span<float> data, int peer, int tag) {
  const std::string what = fmt::format("recv from rank {} (tag {})", peer, tag);
  MT_TRY(check_alive(what));
  if (peer < 0 || peer >= world_size())
    return fail(make_error("rank {}: {}: no such rank in a world of {}", rank_, what, world_size()));
  auto& mb = *hub_->mailboxes_[static_cast<std::size_t>(rank_)];
  const std::pair<int, int> key{peer, tag};
  std::unique_lock lock(mb.mu);
  auto have = [&] {
    auto it = mb.queues.find(key);
    return it != mb.queues.end() && !it->second.empty();
  };
  mb.cv.wait_until(lock, Clock::now() + hub_->options().timeout,
                   [&] { return have() || hub_->poisoned() || hub_->exited(peer); });
  if (!have()) {
    lock.unlock();
    if (hub_->poisoned())
      return make_error("rank {}: {}: aborted, another rank failed: {}", rank_, what,
                        hub_->failure()->message());
    if (hub_->exited(peer))
      return fail(make_error("rank {}: {}: rank {} returned without sending it", rank_, what, peer));
    return fail(make_error("rank {}: {}: timed out after {} ms; still waiting for rank {}", rank_,
                           what, hub_->options().timeout.count(), peer));
  }
  auto it = mb.queues.find(key);
  std::vector<float> message = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mb.queues.erase(it);
  lock.unlock();
  if (message.size() != data.size())
    return fail(make_error("rank {}: {}: message has {} elements but the buffer holds {}", rank_, what,
                           message.size(), data.size()));
  comm::copy_floats(data.data(), message.data(), message.size());
  return ok_status();
}

Status run_ranks(int world, const std::function<Status(int rank, Communicator& comm)>& body,
                 CommOptions options) {
  if (world < 1) return make_error("run_ranks: world size must be at least 1, got {}", world);
  auto hub = std::make_shared<InProcessHub>(world, options);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    try {
      threads.emplace_back([&hub, &body, r] {
        InProcessCommunicator comm(hub, r);
        Status s;
        try {
          s = body(r, comm);
        } catch (const std::exception& e) {
          s = make_error("rank {}: uncaught exception: {}", r, e.what());
        } catch (...) {
          s = make_error("rank {}: uncaught exception", r);
        }
        if (!s.ok()) hub->poison(s.error());
        hub->mark_exited(r);
      });
    } catch (const std::system_error& e) {
      // Ranks that never started must not leave the started ones waiting.
      hub->poison(make_error("run_ranks: cannot start the thread of rank {}: {}", r, e.what()));
      for (int q = r; q < world; ++q) hub->mark_exited(q);
      break;
    }
  }
  for (auto& t : threads) t.join();
  if (auto f = hub->failure()) return *f;
  return ok_status();
}

}  // namespace meshtrain
