// Collectives and send/recv on the sim backend: executor collectives and
// flows among representatives, analytic durations where members are not
// simulated, and the per-kind statistics of both.
#include "backends/sim/sim_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "backends/collective_checks.h"
#include "backends/fp8_wire.h"
#include "backends/op_table.h"
#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;
using sim_internal::seconds;

Result<sim::Time> SimCluster::analytic(const sim::CollectiveRequest& request) {
  auto key = std::make_tuple(static_cast<int>(request.kind), request.bytes, request.members, request.experts,
                             request.top_k);
  if (auto it = analytic_cache_.find(key); it != analytic_cache_.end()) return it->second;
  const int n = static_cast<int>(request.members.size());
  sim::Time t = 0;
  std::optional<double> busbw;
  // A deduplicated dispatch (request.experts) is not what nccl-tests measured: the model times it.
  if (options_.calibration != nullptr && request.experts == 0)
    busbw = options_.calibration->collective_busbw(request.kind, n, request.bytes);
  if (busbw && *busbw > 0) {
    // Measured bus bandwidth already includes per-step costs (as CollectiveEngine uses it).
    t = static_cast<sim::Time>(request.bytes * sim::busbw_factor(request.kind, n) / *busbw *
                               static_cast<double>(sim::kSecond));
  } else {
    MT_ASSIGN(sim::CollectivePlan plan, sim::plan_collective(cluster_, constants_, request, &step_costs_));
    t = sim::analytic_time(cluster_, constants_, plan, &step_costs_);
  }
  analytic_cache_.emplace(std::move(key), t);
  return t;
}

bool SimCluster::across_stages(int job, const Group& g) const {
  const std::vector<int>& stage_of = stage_of_rank_[static_cast<std::size_t>(job)];
  if (stage_of.empty()) return false;
  // Ranks that are not simulated (-1, representative fidelity) belong to some stage's class: skipped.
  int first = -1;
  for (int r : g.ranks) {
    const int s = stage_of[static_cast<std::size_t>(r)];
    if (s < 0) continue;
    if (first < 0) first = s;
    else if (s != first) return true;
  }
  return false;
}

void SimCluster::collective(int job, int rank, sim::StreamId stream, const Group& g,
                            sim::CollectiveRequest request) {
  if (error_) return;
  if (g.index_of(rank) < 0) misuse("collective on group {}: rank {} is not a member", g.id, rank);
  // Members are GPUs. In full fidelity they are sorted by GPU id, as the
  // executor's member sets are, so that replicas meet the same ring.
  const int root_gpu = gpu(job, g.ranks[static_cast<std::size_t>(request.root)]);
  request.members.clear();
  for (int r : g.ranks) request.members.push_back(gpu(job, r));
  if (full()) {
    std::sort(request.members.begin(), request.members.end());
    request.root = static_cast<int>(std::find(request.members.begin(), request.members.end(), root_gpu) -
                                    request.members.begin());
  }
  const char* kind = sim::collective_kind_name(request.kind);
  const std::string name = across_stages(job, g) ? fmt::format("{}{}", kind, kAcrossStages) : std::string(kind);
  std::vector<int> simulated_members;
  for (int r : g.ranks)
    if (simulated(job, r)) simulated_members.push_back(gpu(job, r));
  const bool all = simulated_members.size() == g.ranks.size();
  sim::Executor& ex = *executor_;
  if (all || simulated_members.size() > 1) {
    // The k-th call of this member on the group is the group's k-th collective.
    std::vector<sim::CollectiveId>& list = group_collectives_[{job, g.id}];
    const std::size_t k = joined_[{job, g.id, rank}]++;
    if (k == list.size()) {
      sim::CollectiveRequest joined = request;
      joined.members = simulated_members;
      // Only some members are simulated: they meet with no payload, and the
      // full collective is timed analytically below.
      if (!all) joined.bytes = 0;
      auto id = ex.add_collective(joined, ex.intern(name));
      if (!id)
        return fail(std::move(id).error().context(fmt::format("{} on group {}", kind, g.id)));
      list.push_back(*id);
      // The executor reports its collectives' time and count, not their
      // bytes: count them here, once, when the collective is created.
      if (all) analytic_stats_[static_cast<std::size_t>(request.kind)].bytes += request.bytes;
    }
    if (Status s = ex.join_collective(stream, list[k]); !s) return fail(std::move(s).error());
    if (all) return;
  }
  if (g.size() == 1) return;
  auto t = analytic(request);
  if (!t) return fail(std::move(t).error().context(fmt::format("{} on group {}", kind, g.id)));
  if (Status s = ex.compute(stream, ex.intern(kind), *t, true); !s) return fail(std::move(s).error());
  // Counted once per collective: by its lowest simulated member.
  if (simulated_members.front() == gpu(job, rank)) {
    SimCollectiveStats& st = analytic_stats_[static_cast<std::size_t>(request.kind)];
    st.time_s += seconds(*t);
    ++st.count;
    st.bytes += request.bytes;
  }
}

void SimCluster::point_to_point(int job, int rank, sim::StreamId stream, int peer, double bytes,
                                bool is_send) {
  if (error_) return;
  sim::Executor& ex = *executor_;
  const sim::NameId name = ex.intern(is_send ? "send" : "recv");
  const int self_gpu = gpu(job, rank), peer_gpu = gpu(job, peer);
  if (simulated(job, peer)) {
    if (is_send) {
      // A send does not hold up the issuing stream (as the cpu backend's
      // buffered send, or NCCL sends on a stream of their own): it runs on a
      // per-peer stream after what was issued before it, so two stages that
      // send to each other and then receive do not deadlock.
      auto it = send_streams_.find({job, rank, peer});
      if (it == send_streams_.end()) {
        auto st = ex.stream(self_gpu, fmt::format("send to {}", peer));
        if (!st) return fail(std::move(st).error());
        it = send_streams_.emplace(std::make_tuple(job, rank, peer), *st).first;
      }
      const sim::NameId ready = ex.intern(fmt::format("send {}", sends_++));
      if (Status s = ex.record(stream, ready); !s) return fail(std::move(s).error());
      if (Status s = ex.wait(it->second, ready); !s) return fail(std::move(s).error());
      stream = it->second;
    }
    Status s = is_send ? ex.send(stream, peer_gpu, bytes, name) : ex.recv(stream, peer_gpu, name);
    if (!s) fail(std::move(s).error());
    if (is_send)
      analytic_stats_[static_cast<std::size_t>(sim::CollectiveKind::kSendRecv)].bytes += bytes;
    return;
  }
  sim::CollectiveRequest request{
      sim::CollectiveKind::kSendRecv,
      is_send ? std::vector<int>{self_gpu, peer_gpu} : std::vector<int>{peer_gpu, self_gpu}, bytes};
  auto t = analytic(request);
  if (!t) return fail(std::move(t).error().context(is_send ? "send" : "recv"));
  if (Status s = ex.compute(stream, name, *t, true); !s) return fail(std::move(s).error());
  SimCollectiveStats& st =
      analytic_stats_[static_cast<std::size_t>(sim::CollectiveKind::kSendRecv)];
  st.time_s += seconds(*t);
  ++st.count;
  st.bytes += bytes;
}

void SimBackend::collective(sim::CollectiveKind kind, double bytes, const Group& g, int root) {
  if (g.size() > 1 && kind != sim::CollectiveKind::kAllToAll) {
    // What this rank puts on the wire under the ring algorithms (n members,
    // `bytes` the nccl-tests size): all-reduce 2(n-1)/n, reduce-scatter and
    // all-gather (n-1)/n, broadcast at most the message.
    const double n = g.size(), share = (n - 1) / n;
    const double sent = kind == sim::CollectiveKind::kAllReduce ? 2 * share * bytes
                        : kind == sim::CollectiveKind::kBroadcast ? bytes
                                                                  : share * bytes;
    region().sent_bytes += sent;
  }
  sim::CollectiveRequest request;
  request.kind = kind;
  request.bytes = bytes;
  request.root = root;
  collective(g, std::move(request));
}

void SimBackend::collective(const Group& g, sim::CollectiveRequest request) {
  cluster_.collective(job_, rank_, executor_stream(current_), g, std::move(request));
}

void SimBackend::all_reduce(Tensor& x, const Group& g, ReduceOp) {
  check(x, "all_reduce");
  collective(sim::CollectiveKind::kAllReduce, op_cost(op_info("all_reduce"), {&x}).bytes, g);
}
void SimBackend::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp) {
  check(in, "reduce_scatter"), check(out, "reduce_scatter");
  if (in.numel() != out.numel() * g.size())
    misuse("reduce_scatter: in {} is not {} x out {}", in.shape().str(), g.size(),
           out.shape().str());
  collective(sim::CollectiveKind::kReduceScatter, op_cost(op_info("reduce_scatter"), {&in, &out}).bytes, g);
}
void SimBackend::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  gather(in, out, g, static_cast<double>(dtype_size(in.dtype())));
}
void SimBackend::gather(const Tensor& in, Tensor& out, const Group& g, double element) {
  check(in, "all_gather"), check(out, "all_gather");
  if (out.numel() != in.numel() * g.size())
    misuse("all_gather: out {} is not {} x in {}", out.shape().str(), g.size(), in.shape().str());
  collective(sim::CollectiveKind::kAllGather,
             op_cost(op_info("all_gather"), {&in, &out}).bytes * element / static_cast<double>(dtype_size(in.dtype())),
             g);
}
void SimBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  check(x, "broadcast");
  const int root = g.index_of(root_global_rank);
  if (root < 0) misuse("broadcast: root {} is not in group {}", root_global_rank, g.id);
  collective(sim::CollectiveKind::kBroadcast, op_cost(op_info("broadcast"), {&x}).bytes, g, root);
}
void SimBackend::all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) {
  if (fp8_elements < 0 || fp8_elements > out.numel())
    misuse("all_gather_fp8: {} FP8 elements of out {}", fp8_elements, out.shape().str());
  // The mean bytes of out's elements.
  const double n = static_cast<double>(out.numel());
  gather(in, out, g, n > 0 ? fp8_gather_bytes(out.numel(), fp8_elements, in.dtype()) / n : 1.0);
}
void SimBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                            Tensor& out, std::span<const std::int64_t> recv_counts, const Group& g) {
  exchange(in, send_counts, out, recv_counts, g, static_cast<double>(dtype_size(in.dtype())));
}
void SimBackend::all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                                std::span<const std::int64_t> recv_counts, const Group& g) {
  exchange(in, send_counts, out, recv_counts, g, 1.0);
}
void SimBackend::exchange(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                          std::span<const std::int64_t> recv_counts, const Group& g, double element) {
  check(in, "all_to_all"), check(out, "all_to_all");
  const std::int64_t sent =
      std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  const std::int64_t received =
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  // An uneven exchange ends when its busiest member has moved its bytes: a
  // rank that receives more than it sends (the one holding the hot experts)
  // is timed on what it receives.
  const std::int64_t to_self = send_counts[static_cast<std::size_t>(g.index_of(rank_))];
  region().sent_bytes += static_cast<double>(sent - to_self) * element;
  const Tensor* tensors[] = {&in, &out};
  OpArgs args{tensors};
  args.exchanged = std::max(sent, received);
  sim::CollectiveRequest request;
  request.kind = sim::CollectiveKind::kAllToAll;
  request.bytes = op_cost(op_info("all_to_all"), args).bytes * element / static_cast<double>(dtype_size(in.dtype()));
  if (g.id == expert_group_ && in.dtype() != DType::i32) {
    request.experts = experts_;
    request.top_k = top_k_;
  }
  collective(g, std::move(request));
}
void SimBackend::send(const Tensor& x, int peer, int) {
  check(x, "send");
  if (auto problem = peer_problem("send", peer, rank_, world_size_); !problem.empty()) misuse("{}", problem);
  const double bytes = op_cost(op_info("send"), {&x}).bytes;
  region().sent_bytes += bytes;
  cluster_.point_to_point(job_, rank_, executor_stream(current_), peer, bytes, true);
}
void SimBackend::recv(Tensor& x, int peer, int) {
  check(x, "recv");
  if (auto problem = peer_problem("recv", peer, rank_, world_size_); !problem.empty()) misuse("{}", problem);
  cluster_.point_to_point(job_, rank_, executor_stream(current_), peer, op_cost(op_info("recv"), {&x}).bytes, false);
}
void SimBackend::barrier(const Group& g) {
  // NCCL has no barrier; frameworks all-reduce one element (the table's barrier bytes).
  collective(sim::CollectiveKind::kAllReduce, op_cost(op_info("barrier"), OpArgs{}).bytes, g);
}

}  // namespace meshtrain
