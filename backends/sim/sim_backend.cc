#include "backends/sim/sim_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

namespace meshtrain {

namespace {

template <class... Args>
[[noreturn]] void misuse(fmt::format_string<Args...> f, Args&&... args) {
  std::fprintf(stderr, "meshtrain: sim backend misuse: %s\n",
               fmt::format(f, std::forward<Args>(args)...).c_str());
  std::abort();
}

double seconds(sim::Time t) { return static_cast<double>(t) / static_cast<double>(sim::kSecond); }

}  // namespace

struct SimBackend::Accounting {
  std::int64_t live = 0;  // one host thread issues and frees (backend contract)
  std::int64_t peak = 0;
};

namespace {

class SimStorage final : public Storage {
 public:
  SimStorage(std::shared_ptr<SimBackend::Accounting> accounting, std::int64_t bytes)
      : accounting_(std::move(accounting)), bytes_(bytes) {
    accounting_->live += bytes_;
    accounting_->peak = std::max(accounting_->peak, accounting_->live);
  }
  ~SimStorage() override { accounting_->live -= bytes_; }
  SimStorage(const SimStorage&) = delete;
  SimStorage& operator=(const SimStorage&) = delete;
  const SimBackend::Accounting* owner() const { return accounting_.get(); }

 private:
  std::shared_ptr<SimBackend::Accounting> accounting_;
  std::int64_t bytes_;
};

}  // namespace

// ---- SimCluster ---------------------------------------------------------------

Result<std::unique_ptr<SimCluster>> SimCluster::create(const sim::ClusterSpec& spec, int world_size,
                                                       std::vector<int> representatives,
                                                       SimOptions options) {
  if (representatives.empty())
    return make_error("a simulation needs at least one representative rank");
  std::vector<int> sorted = representatives;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return make_error("representative ranks must be distinct");
  if (sorted.front() < 0 || sorted.back() >= world_size)
    return make_error("representative rank {} is outside the world of {} ranks",
                      sorted.front() < 0 ? sorted.front() : sorted.back(), world_size);
  // Links at the share of their line rate that collectives reach
  // (CostConstants), except those a calibration measured (already achieved
  // rates, applied to `spec` by apply_link_calibration). PCIe only carries
  // GPU<->NIC traffic at the NIC's rate and is left as is.
  const sim::CostConstants constants;
  auto measured = [&](std::string_view kind) {
    if (options.calibration == nullptr) return false;
    for (const auto& l : options.calibration->links)
      if (l.kind == kind) return true;
    return false;
  };
  sim::ClusterSpec effective = spec;
  if (!measured("nvlink")) effective.nvlink_bandwidth *= constants.nvlink_efficiency;
  if (!measured("nic")) effective.nic_bandwidth *= constants.network_efficiency;
  MT_ASSIGN(sim::Cluster cluster, sim::Cluster::build(effective, world_size));
  return std::unique_ptr<SimCluster>(
      new SimCluster(std::move(cluster), spec, std::move(representatives), options));
}

SimCluster::SimCluster(sim::Cluster cluster, const sim::ClusterSpec& spec, std::vector<int> reps,
                       SimOptions options)
    : cluster_(std::move(cluster)),
      cost_(spec.device, constants_, options.calibration),
      options_(options),
      reps_(std::move(reps)) {
  executor_ = std::make_unique<sim::Executor>(cluster_, constants_,
                                              sim::ExecutorOptions{options.mode, options.trace});
  for (std::size_t i = 0; i < reps_.size(); ++i) {
    rep_index_[reps_[i]] = i;
    backends_.push_back(std::make_unique<SimBackend>(*this, reps_[i], cluster_.num_gpus()));
  }
}

SimCluster::~SimCluster() = default;

SimBackend& SimCluster::backend(int global_rank) {
  auto it = rep_index_.find(global_rank);
  if (it == rep_index_.end())
    misuse("rank {} is not a representative of this simulation", global_rank);
  return *backends_[it->second];
}

void SimCluster::fail(Error e) {
  if (!error_) error_ = std::move(e);
}

Result<sim::Time> SimCluster::analytic(const sim::CollectiveRequest& request) {
  auto key = std::make_tuple(static_cast<int>(request.kind), request.bytes, request.members);
  if (auto it = analytic_cache_.find(key); it != analytic_cache_.end()) return it->second;
  const int n = static_cast<int>(request.members.size());
  sim::Time t = 0;
  std::optional<double> busbw;
  if (options_.calibration != nullptr)
    busbw = options_.calibration->collective_busbw(request.kind, n, request.bytes);
  if (busbw && *busbw > 0) {
    // Measured bus bandwidth already includes per-step costs (as CollectiveEngine uses it).
    t = static_cast<sim::Time>(request.bytes * sim::busbw_factor(request.kind, n) / *busbw *
                               static_cast<double>(sim::kSecond));
  } else {
    MT_ASSIGN(sim::CollectivePlan plan, sim::plan_collective(cluster_, constants_, request));
    t = sim::analytic_time(cluster_, constants_, plan);
  }
  analytic_cache_.emplace(std::move(key), t);
  return t;
}

void SimCluster::collective(int rank, sim::StreamId stream, const Group& g,
                            sim::CollectiveRequest request) {
  if (error_) return;
  if (g.index_of(rank) < 0) misuse("collective on group {}: rank {} is not a member", g.id, rank);
  request.members = g.ranks;
  const char* kind = sim::collective_kind_name(request.kind);
  std::vector<int> simulated_members;
  for (int r : g.ranks)
    if (simulated(r)) simulated_members.push_back(r);
  const bool all = simulated_members.size() == g.ranks.size();
  sim::Executor& ex = *executor_;
  if (all || simulated_members.size() > 1) {
    // The k-th call of this member on the group is the group's k-th collective.
    std::vector<sim::CollectiveId>& list = group_collectives_[g.id];
    const std::size_t k = joined_[{g.id, rank}]++;
    if (k == list.size()) {
      sim::CollectiveRequest joined = request;
      joined.members = simulated_members;
      // Only some members are simulated: they meet with no payload, and the
      // full collective is timed analytically below.
      if (!all) joined.bytes = 0;
      auto id = ex.add_collective(joined, ex.intern(kind));
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
  if (Status s = ex.compute(stream, ex.intern(kind), *t); !s) return fail(std::move(s).error());
  // Counted once per collective: by its lowest simulated member.
  if (simulated_members.front() == rank) {
    SimCollectiveStats& st = analytic_stats_[static_cast<std::size_t>(request.kind)];
    st.time_s += seconds(*t);
    ++st.count;
    st.bytes += request.bytes;
  }
}

void SimCluster::point_to_point(int rank, sim::StreamId stream, int peer, double bytes,
                                bool is_send) {
  if (error_) return;
  sim::Executor& ex = *executor_;
  const sim::NameId name = ex.intern(is_send ? "send" : "recv");
  if (simulated(peer)) {
    if (is_send) {
      // A send does not hold up the issuing stream (as the cpu backend's
      // buffered send, or NCCL sends on a stream of their own): it runs on a
      // per-peer stream after what was issued before it, so two stages that
      // send to each other and then receive do not deadlock.
      auto it = send_streams_.find({rank, peer});
      if (it == send_streams_.end()) {
        auto st = ex.stream(rank, fmt::format("send to {}", peer));
        if (!st) return fail(std::move(st).error());
        it = send_streams_.emplace(std::make_pair(rank, peer), *st).first;
      }
      const sim::NameId ready = ex.intern(fmt::format("send {}", sends_++));
      if (Status s = ex.record(stream, ready); !s) return fail(std::move(s).error());
      if (Status s = ex.wait(it->second, ready); !s) return fail(std::move(s).error());
      stream = it->second;
    }
    Status s = is_send ? ex.send(stream, peer, bytes, name) : ex.recv(stream, peer, name);
    if (!s) fail(std::move(s).error());
    if (is_send)
      analytic_stats_[static_cast<std::size_t>(sim::CollectiveKind::kSendRecv)].bytes += bytes;
    return;
  }
  sim::CollectiveRequest request{
      sim::CollectiveKind::kSendRecv,
      is_send ? std::vector<int>{rank, peer} : std::vector<int>{peer, rank}, bytes};
  auto t = analytic(request);
  if (!t) return fail(std::move(t).error().context(is_send ? "send" : "recv"));
  if (Status s = ex.compute(stream, name, *t); !s) return fail(std::move(s).error());
  SimCollectiveStats& st =
      analytic_stats_[static_cast<std::size_t>(sim::CollectiveKind::kSendRecv)];
  st.time_s += seconds(*t);
  ++st.count;
  st.bytes += bytes;
}

Result<SimReport> SimCluster::run() {
  if (ran_) return make_error("this simulation already ran; build a new SimCluster for another");
  ran_ = true;
  if (error_) return *error_;
  MT_ASSIGN(sim::RunReport r, executor_->run());
  SimReport out;
  out.iteration_s = seconds(r.makespan);
  out.events = r.events;
  out.collectives = analytic_stats_;
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    out.collectives[k].time_s += seconds(r.collective_time[k]);
    out.collectives[k].count += r.collective_count[k];
  }
  for (const sim::StreamReport& s : r.streams) out.tasks += s.tasks;
  for (std::size_t i = 0; i < reps_.size(); ++i) {
    SimBackend& b = *backends_[i];
    SimRankReport rr;
    rr.rank = reps_[i];
    rr.peak_bytes = b.memory_stats().peak_bytes;
    rr.compute_s = b.compute_seconds();
    for (const sim::StreamReport& s : r.streams)
      if (s.device == reps_[i]) rr.tasks += s.tasks;
    // Reports keep stream creation order within a device, and each
    // backend creates its default (compute) stream first.
    for (const sim::StreamReport& s : r.streams)
      if (s.device == reps_[i]) {
        rr.compute_busy_s = seconds(s.busy);
        break;
      }
    rr.idle_s = std::max(0.0, out.iteration_s - rr.compute_busy_s);
    out.ranks.push_back(rr);
  }
  return out;
}

// ---- SimBackend ---------------------------------------------------------------

SimBackend::SimBackend(SimCluster& cluster, int rank, int world_size)
    : cluster_(cluster),
      rank_(rank),
      world_size_(world_size),
      accounting_(std::make_shared<Accounting>()) {
  create_stream("compute");
}

SimBackend::~SimBackend() = default;

Tensor SimBackend::empty(const Shape& shape, DType dtype) {
  for (auto d : shape.dims())
    if (d < 0) misuse("empty: negative dimension in {}", shape.str());
  const auto bytes =
      static_cast<std::int64_t>(shape.numel()) * static_cast<std::int64_t>(dtype_size(dtype));
  return Tensor(std::make_shared<SimStorage>(accounting_, bytes), shape, dtype);
}

Tensor SimBackend::zeros(const Shape& shape, DType dtype) { return empty(shape, dtype); }

MemoryStats SimBackend::memory_stats() const { return {accounting_->live, accounting_->peak}; }

void SimBackend::reset_peak() { accounting_->peak = accounting_->live; }

void SimBackend::check(const Tensor& t, const char* op) const {
  if (!t.defined()) misuse("{}: undefined tensor", op);
  auto* s = dynamic_cast<const SimStorage*>(t.storage());
  if (s == nullptr || s->owner() != accounting_.get())
    misuse("{}: tensor belongs to another backend (rank {} got a foreign tensor)", op, rank_);
}

void SimBackend::write(Tensor& dst, std::span<const float> host) {
  check(dst, "write");
  if (host.size() != static_cast<std::size_t>(dst.numel()))
    misuse("write: {} host values for a tensor of {}", host.size(), dst.numel());
}

void SimBackend::write(Tensor& dst, std::span<const std::int32_t> host) {
  check(dst, "write");
  if (host.size() != static_cast<std::size_t>(dst.numel()))
    misuse("write: {} host values for a tensor of {}", host.size(), dst.numel());
}

void SimBackend::init_normal(Tensor& x, const NormalInitOp&) { check(x, "init_normal"); }

Status SimBackend::read(const Tensor& src, std::span<float> host) {
  check(src, "read");
  if (host.size() != static_cast<std::size_t>(src.numel()))
    misuse("read: host span of {} for a tensor of {}", host.size(), src.numel());
  std::fill(host.begin(), host.end(), 0.f);
  if (cluster_.error_) return *cluster_.error_;
  return ok_status();
}

Stream SimBackend::create_stream(std::string_view name) {
  const int id = static_cast<int>(streams_.size());
  // Executor streams are named per device; the id keeps equal names apart.
  auto s = cluster_.executor_->stream(rank_,
                                      id == 0 ? std::string(name) : fmt::format("{} {}", name, id));
  if (!s) misuse("create_stream: {}", s.error().message());
  streams_.push_back(*s);
  return Stream{id};
}

void SimBackend::set_stream(Stream s) {
  if (s.id < 0 || s.id >= static_cast<int>(streams_.size()))
    misuse("set_stream: stream {} was not created here", s.id);
  current_ = s;
}

sim::StreamId SimBackend::executor_stream(Stream s) const {
  if (s.id < 0 || s.id >= static_cast<int>(streams_.size()))
    misuse("stream {} was not created here", s.id);
  return streams_[static_cast<std::size_t>(s.id)];
}

Event SimBackend::record(Stream s) {
  const sim::StreamId st = executor_stream(s);
  const Event e{static_cast<std::int64_t>(events_.size())};
  events_.push_back(cluster_.executor_->intern(fmt::format("event {}", e.id)));
  if (Status r = cluster_.executor_->record(st, events_.back()); !r)
    cluster_.fail(std::move(r).error());
  return e;
}

void SimBackend::wait(Stream s, Event e) {
  const sim::StreamId st = executor_stream(s);
  if (!e.valid() || e.id >= static_cast<std::int64_t>(events_.size()))
    misuse("wait: event {} was not recorded here", e.id);
  if (Status r = cluster_.executor_->wait(st, events_[static_cast<std::size_t>(e.id)]); !r)
    cluster_.fail(std::move(r).error());
}

Status SimBackend::synchronize() {
  if (cluster_.error_) return *cluster_.error_;
  return ok_status();
}

double SimBackend::compute_seconds() const { return seconds(compute_); }

sim::NameId SimBackend::op_name(std::string_view name) { return cluster_.executor_->intern(name); }

sim::DType SimBackend::compute_dtype(DType t) const {
  return t == DType::bf16 || t == DType::f16 ? sim::DType::kBf16 : sim::DType::kFp32;
}

void SimBackend::compute(sim::NameId name, sim::Time duration) {
  if (cluster_.error_) return;
  compute_ += duration;
  if (Status s = cluster_.executor_->compute(executor_stream(current_), name, duration); !s)
    cluster_.fail(std::move(s).error());
}

void SimBackend::memory_op(sim::NameId name, std::initializer_list<const Tensor*> tensors) {
  double bytes = 0;
  for (const Tensor* t : tensors)
    if (t->defined()) bytes += static_cast<double>(t->bytes());
  compute(name, cluster_.cost_.memory_bound(bytes, cluster_.executor_->name(name)));
}

void SimBackend::fill(Tensor& x, float) {
  check(x, "fill");
  memory_op(op_name("fill"), {&x});
}
void SimBackend::copy(const Tensor& src, Tensor& dst) {
  check(src, "copy"), check(dst, "copy");
  if (src.numel() != dst.numel() || src.dtype() != dst.dtype())
    misuse("copy: {} {} into {} {}", src.shape().str(), dtype_name(src.dtype()), dst.shape().str(),
           dtype_name(dst.dtype()));
  memory_op(op_name("copy"), {&src, &dst});
}
void SimBackend::cast(const Tensor& src, Tensor& dst) {
  check(src, "cast"), check(dst, "cast");
  if (src.numel() != dst.numel()) misuse("cast: {} into {}", src.shape().str(), dst.shape().str());
  memory_op(op_name("cast"), {&src, &dst});
}
void SimBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check(a, "add"), check(b, "add"), check(out, "add");
  memory_op(op_name("add"), {&a, &b, &out});
}
void SimBackend::scale(Tensor& x, float) {
  check(x, "scale");
  memory_op(op_name("scale"), {&x, &x});
}
void SimBackend::axpy(float, const Tensor& x, Tensor& y) {
  check(x, "axpy"), check(y, "axpy");
  memory_op(op_name("axpy"), {&x, &y, &y});
}
void SimBackend::sum(const Tensor& x, Tensor& out, float, bool) {
  check(x, "sum"), check(out, "sum");
  memory_op(op_name("sum"), {&x, &out});
}
void SimBackend::sum_squares(const Tensor& x, Tensor& out, bool) {
  check(x, "sum_squares"), check(out, "sum_squares");
  memory_op(op_name("sum_squares"), {&x, &out});
}

void SimBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp&) {
  check(a, "gemm"), check(b, "gemm"), check(c, "gemm");
  const std::int64_t n = c.shape().back(), m = c.numel() / std::max<std::int64_t>(n, 1);
  const std::int64_t k = a.numel() / std::max<std::int64_t>(m, 1);
  if (m * k != a.numel() || k * n != b.numel())
    misuse("gemm: a {} b {} c {} do not agree", a.shape().str(), b.shape().str(), c.shape().str());
  compute(op_name("gemm"), cluster_.cost_.gemm(m, n, k, compute_dtype(a.dtype())));
}
void SimBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp&) {
  check(a, "batched_gemm"), check(b, "batched_gemm"), check(c, "batched_gemm");
  if (a.shape().rank() != 3 || c.shape().rank() != 3)
    misuse("batched_gemm: a {} and c {} must be (L, ., .)", a.shape().str(), c.shape().str());
  const std::int64_t l = c.shape()[0], m = c.shape()[1], n = c.shape()[2];
  const std::int64_t k = a.numel() / std::max<std::int64_t>(l * m, 1);
  compute(op_name("batched_gemm"), cluster_.cost_.gemm(m, n, k, compute_dtype(a.dtype()), l));
}
void SimBackend::bias_backward(const Tensor& dy, Tensor& db) {
  check(dy, "bias_backward"), check(db, "bias_backward");
  memory_op(op_name("bias_backward"), {&dy, &db});
}

void SimBackend::embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                   std::int64_t) {
  check(table, "embedding_forward"), check(ids, "embedding_forward"),
      check(out, "embedding_forward");
  // Reads one row per token, not the whole table.
  memory_op(op_name("embedding_forward"), {&ids, &out, &out});
}
void SimBackend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                    std::int64_t) {
  check(dout, "embedding_backward"), check(ids, "embedding_backward"),
      check(dtable, "embedding_backward");
  memory_op(op_name("embedding_backward"), {&dout, &ids, &dout});
}

void SimBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   Tensor& out, Tensor& mean, Tensor& rstd, float) {
  check(x, "layernorm_forward"), check(out, "layernorm_forward");
  memory_op(op_name("layernorm_forward"), {&x, &weight, &bias, &out, &mean, &rstd});
}
void SimBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias) {
  check(dout, "layernorm_backward"), check(dx, "layernorm_backward");
  memory_op(op_name("layernorm_backward"),
            {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
}
void SimBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                                 float) {
  check(x, "rmsnorm_forward"), check(out, "rmsnorm_forward");
  memory_op(op_name("rmsnorm_forward"), {&x, &weight, &out, &rstd});
}
void SimBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  check(dout, "rmsnorm_backward"), check(dx, "rmsnorm_backward");
  memory_op(op_name("rmsnorm_backward"), {&dout, &x, &weight, &rstd, &dx, &dweight});
}

void SimBackend::gelu_forward(const Tensor& x, Tensor& out) {
  check(x, "gelu_forward"), check(out, "gelu_forward");
  memory_op(op_name("gelu_forward"), {&x, &out});
}
void SimBackend::gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  check(dout, "gelu_backward"), check(dx, "gelu_backward");
  memory_op(op_name("gelu_backward"), {&dout, &x, &dx});
}
void SimBackend::swiglu_forward(const Tensor& x, Tensor& out) {
  check(x, "swiglu_forward"), check(out, "swiglu_forward");
  memory_op(op_name("swiglu_forward"), {&x, &out});
}
void SimBackend::swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  check(dout, "swiglu_backward"), check(dx, "swiglu_backward");
  memory_op(op_name("swiglu_backward"), {&dout, &x, &dx});
}
void SimBackend::dropout_forward(const Tensor& x, Tensor& out, const DropoutOp&) {
  check(x, "dropout_forward"), check(out, "dropout_forward");
  memory_op(op_name("dropout_forward"), {&x, &out});
}
void SimBackend::dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp&) {
  check(dout, "dropout_backward"), check(dx, "dropout_backward");
  memory_op(op_name("dropout_backward"), {&dout, &dx});
}

void SimBackend::rope(Tensor& x, int heads_total, int rotate_heads, float, bool) {
  check(x, "rope");
  // Only the rotated heads are read and written.
  const double share = heads_total > 0 ? static_cast<double>(rotate_heads) / heads_total : 1.0;
  compute(op_name("rope"),
          cluster_.cost_.memory_bound(2.0 * static_cast<double>(x.bytes()) * share));
}

void SimBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                   const AttentionOp& op) {
  check(qkv, "attention_forward"), check(out, "attention_forward"), check(lse, "attention_forward");
  if (qkv.shape().rank() != 4)
    misuse("attention_forward: qkv {} must be (B, T, H + 2G, D)", qkv.shape().str());
  if (cluster_.options_.attention == AttentionImpl::unfused)
    return unfused_attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.head_dim, qkv.dtype(),
                             false);
  compute(op_name("attention_forward"),
          cluster_.cost_.attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.head_dim, true,
                                   false, compute_dtype(qkv.dtype())));
}
void SimBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, Tensor& dqkv, const AttentionOp& op) {
  check(dout, "attention_backward"), check(qkv, "attention_backward"),
      check(out, "attention_backward");
  check(lse, "attention_backward"), check(dqkv, "attention_backward");
  if (qkv.shape().rank() != 4)
    misuse("attention_backward: qkv {} must be (B, T, H + 2G, D)", qkv.shape().str());
  if (cluster_.options_.attention == AttentionImpl::unfused)
    return unfused_attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.head_dim, qkv.dtype(),
                             true);
  compute(op_name("attention_backward"),
          cluster_.cost_.attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.head_dim, true,
                                   true, compute_dtype(qkv.dtype())));
}

void SimBackend::unfused_attention(std::int64_t bh, std::int64_t seq, std::int64_t head_dim,
                                   DType dtype, bool backward) {
  const sim::CostModel& cost = cluster_.cost_;
  const sim::DType t = compute_dtype(dtype);
  const double elem = static_cast<double>(dtype_size(dtype));
  const double scores = static_cast<double>(bh) * static_cast<double>(seq) * seq;  // b·a·s²
  const bool dropout = cluster_.options_.attention_dropout > 0;
  // One (s, s) by (s, d) or (s, d) by (d, s) product per sequence and head.
  const sim::Time scores_gemm = cost.gemm(seq, seq, head_dim, t, bh);   // q·kᵀ or dO·Vᵀ
  const sim::Time context_gemm = cost.gemm(seq, head_dim, seq, t, bh);  // P·v, Pᵀ·dO, dS·K, dSᵀ·Q
  if (!backward) {
    compute(op_name("attention_scores"), scores_gemm);
    compute(op_name("attention_softmax"), cost.memory_bound(2 * elem * scores));
    if (dropout) compute(op_name("attention_dropout"), cost.memory_bound((2 * elem + 1) * scores));
    compute(op_name("attention_context"), context_gemm);
    return;
  }
  compute(op_name("attention_context_backward"), context_gemm);  // dV
  compute(op_name("attention_scores_backward"), scores_gemm);    // dP
  if (dropout)
    compute(op_name("attention_dropout_backward"), cost.memory_bound((2 * elem + 1) * scores));
  compute(op_name("attention_softmax_backward"), cost.memory_bound(3 * elem * scores));
  compute(op_name("attention_query_key_backward"), cost.gemm(seq, head_dim, seq, t, 2 * bh));  // dQ, dK
}

void SimBackend::cross_entropy_max(const Tensor& logits, Tensor& row_max) {
  check(logits, "cross_entropy_max"), check(row_max, "cross_entropy_max");
  memory_op(op_name("cross_entropy_max"), {&logits, &row_max});
}
void SimBackend::cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, std::int64_t, Tensor& sumexp,
                                        Tensor& target_logit) {
  check(logits, "cross_entropy_partials"), check(sumexp, "cross_entropy_partials");
  memory_op(op_name("cross_entropy_partials"),
            {&logits, &targets, &row_max, &sumexp, &target_logit});
}
void SimBackend::cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                    const Tensor& target_logit, Tensor& losses) {
  check(row_max, "cross_entropy_loss"), check(losses, "cross_entropy_loss");
  memory_op(op_name("cross_entropy_loss"), {&row_max, &sumexp, &target_logit, &losses});
}
void SimBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, const Tensor& sumexp, std::int64_t,
                                        float, Tensor& dlogits) {
  check(logits, "cross_entropy_backward"), check(dlogits, "cross_entropy_backward");
  memory_op(op_name("cross_entropy_backward"), {&logits, &targets, &row_max, &sumexp, &dlogits});
}

void SimBackend::clip_coefficient(const Tensor& sumsq, float, Tensor& coef) {
  check(sumsq, "clip_coefficient"), check(coef, "clip_coefficient");
  memory_op(op_name("clip_coefficient"), {&sumsq, &coef});
}
void SimBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
                       const AdamWOp&) {
  check(param, "adamw"), check(grad, "adamw"), check(m, "adamw"), check(v, "adamw");
  // Reads param, grad, m, v and writes param, m, v.
  memory_op(op_name("adamw"), {&param, &grad, &m, &v, &param, &m, &v, &coef});
}

void SimBackend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  check(out, "sum_squares");
  double bytes = static_cast<double>(out.bytes());
  for (const Tensor& x : xs) {
    check(x, "sum_squares");
    bytes += static_cast<double>(x.bytes());
  }
  compute(op_name("sum_squares"), cluster_.cost_.memory_bound(bytes, "sum_squares"));
}

void SimBackend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                               const AdamWOp&) {
  // Per tensor as adamw counts it: reads param, grad, m, v and writes param, m, v; coef once.
  double bytes = coef.defined() ? static_cast<double>(coef.bytes()) : 0.0;
  for (const AdamWTensors& t : params) {
    check(t.param, "adamw"), check(t.grad, "adamw"), check(t.m, "adamw"), check(t.v, "adamw");
    bytes += static_cast<double>(2 * t.param.bytes() + t.grad.bytes() + 2 * t.m.bytes() + 2 * t.v.bytes());
  }
  compute(op_name("adamw"), cluster_.cost_.memory_bound(bytes, "adamw"));
}

void SimBackend::collective(sim::CollectiveKind kind, double bytes, const Group& g, int root) {
  sim::CollectiveRequest request;
  request.kind = kind;
  request.bytes = bytes;
  request.root = root;
  cluster_.collective(rank_, executor_stream(current_), g, std::move(request));
}

void SimBackend::all_reduce(Tensor& x, const Group& g, ReduceOp) {
  check(x, "all_reduce");
  collective(sim::CollectiveKind::kAllReduce, static_cast<double>(x.bytes()), g);
}
void SimBackend::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp) {
  check(in, "reduce_scatter"), check(out, "reduce_scatter");
  if (in.numel() != out.numel() * g.size())
    misuse("reduce_scatter: in {} is not {} x out {}", in.shape().str(), g.size(),
           out.shape().str());
  collective(sim::CollectiveKind::kReduceScatter, static_cast<double>(in.bytes()), g);
}
void SimBackend::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  check(in, "all_gather"), check(out, "all_gather");
  if (out.numel() != in.numel() * g.size())
    misuse("all_gather: out {} is not {} x in {}", out.shape().str(), g.size(), in.shape().str());
  collective(sim::CollectiveKind::kAllGather, static_cast<double>(out.bytes()), g);
}
void SimBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  check(x, "broadcast");
  const int root = g.index_of(root_global_rank);
  if (root < 0) misuse("broadcast: root {} is not in group {}", root_global_rank, g.id);
  collective(sim::CollectiveKind::kBroadcast, static_cast<double>(x.bytes()), g, root);
}
void SimBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                            Tensor& out, std::span<const std::int64_t>, const Group& g) {
  check(in, "all_to_all"), check(out, "all_to_all");
  const std::int64_t sent =
      std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  collective(sim::CollectiveKind::kAllToAll,
             static_cast<double>(sent) * static_cast<double>(dtype_size(in.dtype())), g);
}
void SimBackend::send(const Tensor& x, int peer, int) {
  check(x, "send");
  if (peer == rank_ || peer < 0 || peer >= world_size_) misuse("send: bad peer {}", peer);
  cluster_.point_to_point(rank_, executor_stream(current_), peer, static_cast<double>(x.bytes()),
                          true);
}
void SimBackend::recv(Tensor& x, int peer, int) {
  check(x, "recv");
  if (peer == rank_ || peer < 0 || peer >= world_size_) misuse("recv: bad peer {}", peer);
  cluster_.point_to_point(rank_, executor_stream(current_), peer, static_cast<double>(x.bytes()),
                          false);
}
void SimBackend::barrier(const Group& g) {
  // NCCL has no barrier; frameworks all-reduce one element.
  collective(sim::CollectiveKind::kAllReduce, 4.0, g);
}

}  // namespace meshtrain
