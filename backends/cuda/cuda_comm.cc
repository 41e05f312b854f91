// CudaBackend collectives through NCCL on the current stream. A group of one
// is the identity (a copy where in and out differ) and needs no communicator.
#include <cuda_runtime_api.h>
#include <nccl.h>


#include <fmt/ranges.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/collective_checks.h"
#include "backends/cuda/misuse.h"
#include "backends/cuda/nccl_comm.h"

namespace meshtrain::cuda {

#define MT_STREAM static_cast<cudaStream_t>(stream_handle())

void CudaBackend::check_member(const Group& g, std::string_view op) const {
  if (auto problem = member_problem(g, rank_, op); !problem.empty()) misuse("{}", problem);
}

int CudaBackend::nccl_dtype(const Tensor& t, std::string_view op) const {
  switch (t.dtype()) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
  }
  misuse("{}: unknown dtype", op);
}

void CudaBackend::track(std::string op, const Group& g) {
  comms_->track(std::move(op), g.id, fmt::format("{}", fmt::join(g.ranks, ",")), MT_STREAM);
}

namespace {
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }
}  // namespace

// Runs `issue(comm)` for op `name` on g: fetches (or creates) the
// communicator, turns NCCL failures into the sticky error, watches the op and
// counts the `sent` bytes it puts on the wire (bytes_sent()).
#define MT_NCCL(name, g, call, sent)                                                         \
  do {                                                                                       \
    auto comm_ = comms_->get(g);                                                             \
    if (!comm_.ok()) {                                                                       \
      fail(std::move(comm_).error().context(fmt::format("cuda rank {}: {} on group {}", rank_, \
                                                        name, (g).id)));                     \
      return;                                                                                \
    }                                                                                        \
    ncclComm_t comm = *comm_;                                                                \
    if (ncclResult_t r_ = (call); r_ != ncclSuccess) {                                       \
      fail(make_error("cuda rank {}: {} on group {} (ranks {}): {}", rank_, name, (g).id,     \
                      fmt::join((g).ranks, ","), ncclGetErrorString(r_)));                   \
      return;                                                                                \
    }                                                                                        \
    track(name, g);                                                                          \
    bytes_sent_ += (sent);                                                                   \
  } while (0)

void CudaBackend::all_reduce(Tensor& x, const Group& g, ReduceOp op) {
  void* p = ptr(x, "all_reduce");
  check_member(g, "all_reduce");
  if (x.dtype() == DType::i32 && op == ReduceOp::sum) misuse("all_reduce: sum of i32 ids");
  if (failed() || g.size() == 1 || x.numel() == 0) return;
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(x, "all_reduce"));
  // Blocks n·j/G to their owners, then the own reduced block to the others (bytes_sent()).
  const std::int64_t n = x.numel(), G = g.size(), j = g.index_of(rank_), own = n * (j + 1) / G - n * j / G;
  MT_NCCL("all_reduce", g,
          ncclAllReduce(p, p, static_cast<std::size_t>(n), type, nccl_op(op), comm, MT_STREAM),
          (n - own + (G - 1) * own) * static_cast<std::int64_t>(dtype_size(x.dtype())));
}

bool CudaBackend::blocks_to_launch(const Tensor& in, Tensor& out, const Group& g, std::string_view op,
                                   const std::string& problem) {
  check_member(g, op);
  if (!problem.empty()) misuse("{}", problem);
  if (failed()) return false;
  if (g.size() == 1) {
    copy(in, out);
    return false;
  }
  return true;
}

void CudaBackend::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) {
  const void* pi = ptr(in, "reduce_scatter");
  void* po = ptr(out, "reduce_scatter");
  if (!blocks_to_launch(in, out, g, "reduce_scatter", reduce_scatter_problem(in, out, g))) return;
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(in, "reduce_scatter"));
  MT_NCCL("reduce_scatter", g,
          ncclReduceScatter(pi, po, static_cast<std::size_t>(out.numel()), type, nccl_op(op), comm,
                            MT_STREAM),
          (g.size() - 1) * static_cast<std::int64_t>(out.bytes()));
}

void CudaBackend::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  const void* pi = ptr(in, "all_gather");
  void* po = ptr(out, "all_gather");
  if (!blocks_to_launch(in, out, g, "all_gather", all_gather_problem(in, out, g))) return;
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(in, "all_gather"));
  MT_NCCL("all_gather", g,
          ncclAllGather(pi, po, static_cast<std::size_t>(in.numel()), type, comm, MT_STREAM),
          (g.size() - 1) * static_cast<std::int64_t>(in.bytes()));
}

void CudaBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  void* p = ptr(x, "broadcast");
  check_member(g, "broadcast");
  if (auto problem = broadcast_root_problem(g, root_global_rank); !problem.empty())
    misuse("{}", problem);
  const int root = g.index_of(root_global_rank);
  if (failed() || g.size() == 1 || x.numel() == 0) return;
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(x, "broadcast"));
  MT_NCCL("broadcast", g,
          ncclBroadcast(p, p, static_cast<std::size_t>(x.numel()), type, root, comm, MT_STREAM),
          root_global_rank == rank_ ? (g.size() - 1) * static_cast<std::int64_t>(x.bytes()) : 0);
}

void CudaBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                             Tensor& out, std::span<const std::int64_t> recv_counts,
                             const Group& g) {
  auto* pi = static_cast<const std::byte*>(ptr(in, "all_to_all"));
  auto* po = static_cast<std::byte*>(ptr(out, "all_to_all"));
  check_member(g, "all_to_all");
  if (auto problem = all_to_all_problem(in, send_counts, out, recv_counts, g); !problem.empty())
    misuse("{}", problem);
  const auto members = static_cast<std::size_t>(g.size());
  if (failed()) return;
  if (g.size() == 1) {
    copy(in, out);
    return;
  }
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(in, "all_to_all"));
  const std::size_t size = dtype_size(in.dtype());
  const int me = g.index_of(rank_);
  // The block to ourselves is a device copy; the others one grouped send/recv
  // per peer, so NCCL schedules them together without ordering deadlocks.
  std::int64_t so = 0, ro = 0;
  std::vector<std::int64_t> send_off(members), recv_off(members);
  for (std::size_t i = 0; i < members; ++i) {
    send_off[i] = so;
    recv_off[i] = ro;
    so += send_counts[i];
    ro += recv_counts[i];
  }
  const auto self = static_cast<std::size_t>(me);
  if (send_counts[self] != recv_counts[self])
    misuse("all_to_all: rank {} sends itself {} and receives {}", rank_, send_counts[self],
           recv_counts[self]);
  if (send_counts[self] > 0)
    check(cudaMemcpyAsync(po + recv_off[self] * size, pi + send_off[self] * size,
                          static_cast<std::size_t>(send_counts[self]) * size,
                          cudaMemcpyDeviceToDevice, MT_STREAM),
          "all_to_all (own block)");
  const auto grouped = [&](ncclComm_t comm) {
    ncclResult_t r = ncclGroupStart();
    for (std::size_t i = 0; i < members && r == ncclSuccess; ++i) {
      if (i == self) continue;
      if (send_counts[i] > 0)
        r = ncclSend(pi + send_off[i] * size, static_cast<std::size_t>(send_counts[i]), type,
                     static_cast<int>(i), comm, MT_STREAM);
      if (r == ncclSuccess && recv_counts[i] > 0)
        r = ncclRecv(po + recv_off[i] * size, static_cast<std::size_t>(recv_counts[i]), type,
                     static_cast<int>(i), comm, MT_STREAM);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  };
  std::int64_t others = 0;  // elements to the other members
  for (std::size_t i = 0; i < members; ++i)
    if (i != self) others += send_counts[i];
  MT_NCCL("all_to_all", g, grouped(comm), others * static_cast<std::int64_t>(size));
}

void CudaBackend::point_to_point(const Tensor& x, int peer, int tag, bool sending) {
  const char* op = sending ? "send" : "recv";
  void* p = ptr(x, op);
  if (auto problem = peer_problem(op, peer, rank_, world_size_); !problem.empty()) misuse("{}", problem);
  if (failed() || x.numel() == 0) return;
  const auto type = static_cast<ncclDataType_t>(nccl_dtype(x, op));
  const Group pair{NcclComms::kWorldGroup, {std::min(rank_, peer), std::max(rank_, peer)}};
  const std::string name = fmt::format("{} rank {} tag {}", sending ? "send to" : "recv from", peer, tag);
  ncclComm_t comm = comms_->world();
  if (comm == nullptr) misuse("{}: no point-to-point communicator (world of one)", op);
  const auto count = static_cast<std::size_t>(x.numel());
  if (ncclResult_t r = sending ? ncclSend(p, count, type, peer, comm, MT_STREAM)
                               : ncclRecv(p, count, type, peer, comm, MT_STREAM);
      r != ncclSuccess) {
    fail(make_error("cuda rank {}: {}: {}", rank_, name, ncclGetErrorString(r)));
    return;
  }
  track(name, pair);
  if (sending) bytes_sent_ += static_cast<std::int64_t>(x.bytes());
}

void CudaBackend::send(const Tensor& x, int peer, int tag) { point_to_point(x, peer, tag, true); }

void CudaBackend::recv(Tensor& x, int peer, int tag) { point_to_point(x, peer, tag, false); }

void CudaBackend::send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) {
  // ncclSend holds the stream until the peer's ncclRecv starts: a ring step posted as a send, then a
  // receive, on every rank waits forever. One group posts both.
  if (failed()) return;
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    fail(make_error("cuda rank {}: send_recv tag {}: {}", rank_, tag, ncclGetErrorString(r)));
    return;
  }
  send(out, to, tag);
  recv(in, from, tag);
  if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess)
    fail(make_error("cuda rank {}: send to {} and recv from {}, tag {}: {}", rank_, to, from, tag,
                    ncclGetErrorString(r)));
}

void CudaBackend::barrier(const Group& g) {
  check_member(g, "barrier");
  if (failed() || g.size() == 1) return;
  // NCCL has no barrier: a one-element all-reduce orders the members' streams.
  const auto tmp = scratch(sizeof(float), "barrier");
  check(cudaMemsetAsync(tmp.ptr, 0, sizeof(float), MT_STREAM), "barrier");
  void* p = tmp.ptr;
  // Released before use is safe: a later owner of the block is ordered after
  // the all-reduce on this stream.
  release(tmp);
  MT_NCCL("barrier", g, ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm, MT_STREAM), 0);
}

}  // namespace meshtrain::cuda
