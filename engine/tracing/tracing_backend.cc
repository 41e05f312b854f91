#include "engine/tracing/tracing_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "backends/fp8_wire.h"
namespace meshtrain {

namespace {

// {"shapes":["(4, 32)",null,...],"bytes":N<extra>}; an undefined optional
// tensor (a missing bias, no clip coefficient) is null. `bytes` < 0: the sum of
// the defined tensors' bytes.
std::string args_json(std::span<const Tensor* const> tensors, double bytes = -1, const std::string& extra = {}) {
  std::string shapes;
  double total = 0;
  for (const Tensor* t : tensors) {
    if (!shapes.empty()) shapes += ',';
    if (!t->defined()) {
      shapes += "null";
      continue;
    }
    shapes += '"' + t->shape().str() + '"';
    total += static_cast<double>(t->bytes());
  }
  return fmt::format(R"({{"shapes":[{}],"bytes":{:.0f}{}}})", shapes, bytes < 0 ? total : bytes,
                     extra);
}
std::string args_json(std::initializer_list<const Tensor*> tensors, double bytes = -1,
                      const std::string& extra = {}) {
  return args_json(std::span<const Tensor* const>(tensors.begin(), tensors.size()), bytes, extra);
}

// The same for the tensors of a multi-tensor op: the shapes of its fixed
// operands, "tensors": how many groups it covers, the bytes of all of them.
std::string foreach_args_json(std::span<const Tensor* const> fixed, std::size_t tensors, double bytes) {
  std::string shapes;
  for (const Tensor* t : fixed) {
    if (!shapes.empty()) shapes += ',';
    shapes += t->defined() ? '"' + t->shape().str() + '"' : "null";
  }
  return fmt::format(R"({{"shapes":[{}],"bytes":{:.0f},"tensors":{}}})", shapes, bytes, tensors);
}

}  // namespace

namespace {

// Pending pairs without a blocking call before the oldest are read back (see the header), and a
// base older than this many timing events is replaced: both well inside the cuda backend's ring
// of 16384 timing events, which the step timer above shares.
constexpr std::size_t kMaxPending = 4096;
constexpr std::int64_t kBaseAge = 4096;

}  // namespace

TracingBackend::TracingBackend(Backend& target, TraceRecorder& recorder)
    : BackendWrapper(target), recorder_(recorder) {
  trace_.label = fmt::format("rank {} ({})", target.rank(), target.name());
  trace_.streams[0] = "compute";  // the default stream every backend starts with
  // The probe is the default stream's first base: nothing runs on it yet.
  const Stream s = target.current_stream();
  const std::int64_t host_ns = recorder_.now_ns();
  const Event probe = mark(s);
  device_ = probe.valid();
  if (device_) bases_[s.id] = {probe, host_ns, timed_events_};
}

TracingBackend::~TracingBackend() {
  // The end of the run: waiting for the last pairs costs nothing the run would notice.
  resolve_oldest(pending_.size());
  if (unread_ > 0)
    fmt::print(stderr, "warning: --trace: {} ops of rank {} could not be timed on the device ({}); they keep "
               "their host issue times, without \"clock\":\"device\"\n", unread_, rank(), first_unread_error_);
  recorder_.add_rank(rank(), std::move(trace_));
}

Event TracingBackend::mark(Stream s) {
  const Event e = target().timed_event(s);
  if (e.valid()) ++timed_events_;
  return e;
}

Event TracingBackend::timed_event(Stream s) { return mark(s); }

const TracingBackend::Base& TracingBackend::base_for(Stream s) {
  auto it = bases_.find(s.id);
  if (it == bases_.end() || timed_events_ - it->second.issued > kBaseAge) {
    const std::int64_t host_ns = recorder_.now_ns();
    const Event e = mark(s);
    it = bases_.insert_or_assign(s.id, Base{e, host_ns, timed_events_}).first;
  }
  return it->second;
}

void TracingBackend::resolve(const Pending& p) {
  TraceEvent& e = trace_.events[p.index];
  Result<double> from = target().seconds_between(p.base.event, p.start);
  Result<double> to = from.ok() ? target().seconds_between(p.base.event, p.end) : from;
  if (!to.ok()) {
    if (unread_++ == 0) first_unread_error_ = to.error().message();
    return;
  }
  e.start_ns = p.base.host_ns + static_cast<std::int64_t>(std::llround(*from * 1e9));
  e.duration_ns = static_cast<std::int64_t>(std::llround((*to - *from) * 1e9));
  e.device_clock = true;
}

void TracingBackend::resolve_oldest(std::size_t count) {
  count = std::min(count, pending_.size());
  for (std::size_t i = 0; i < count; ++i) resolve(pending_[i]);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(count));
  before_last_block_ -= std::min(before_last_block_, count);
}

void TracingBackend::after_blocking(const Stream* waited) {
  if (!device_) return;
  std::vector<Pending> keep;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    if (waited == nullptr || p.stream == waited->id || i < before_last_block_) resolve(p);
    else keep.push_back(p);
  }
  pending_ = std::move(keep);
  before_last_block_ = pending_.size();
  // The streams the call waited for are idle: a base issued now runs now.
  const std::int64_t host_ns = recorder_.now_ns();
  for (auto& [id, base] : bases_) {
    if (waited != nullptr && id != waited->id) continue;
    const Event e = mark(Stream{id});
    base = {e, host_ns, timed_events_};
  }
}

template <class F>
auto TracingBackend::timed(std::string_view name, const char* category, std::string args, F&& call) {
  const Stream s = target().current_stream();
  // `name` is a literal here or an op table name (a view of one): its data() is one, terminated, for good.
  TraceEvent e{s.id, name.data(), category, 0, 0};
  // Host calls (write, read, synchronize) keep host time.
  const bool on_device = device_ && std::string_view(category) != "host";
  Pending p{0, s.id, on_device ? base_for(s) : Base{}, {}, {}};
  if (on_device) p.start = mark(s);
  e.start_ns = recorder_.now_ns();
  auto finish = [&] {
    e.duration_ns = recorder_.now_ns() - e.start_ns;
    trace_.add(e, args);
    if (!on_device) return;
    p.end = mark(s);
    p.index = trace_.events.size() - 1;
    pending_.push_back(p);
    if (pending_.size() >= kMaxPending) resolve_oldest(kMaxPending / 2);
  };
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    finish();
  } else {
    auto result = call();
    finish();
    return result;
  }
}

template <class F>
void TracingBackend::collective(const char* name, std::initializer_list<const Tensor*> tensors,
                                double bytes, const Group& g, F&& call) {
  timed(name, name, args_json(tensors, bytes, fmt::format(R"(,"group":{},"members":{})", g.id, g.size())),
        std::forward<F>(call));
}

// ---- host transfer and streams ---------------------------------------------------------

void TracingBackend::write(Tensor& dst, std::span<const float> host) {
  timed("write", "host", args_json({&dst}), [&] { target().write(dst, host); });
}
void TracingBackend::write(Tensor& dst, std::span<const std::int32_t> host) {
  timed("write", "host", args_json({&dst}), [&] { target().write(dst, host); });
}
Status TracingBackend::read(const Tensor& src, std::span<float> host) {
  const Stream s = target().current_stream();
  Status r = timed("read", "host", args_json({&src}), [&] { return target().read(src, host); });
  after_blocking(&s);
  return r;
}
Stream TracingBackend::create_stream(std::string_view name) {
  const Stream s = target().create_stream(name);
  trace_.streams[s.id] = std::string(name);
  return s;
}
Status TracingBackend::synchronize() {
  Status r = timed("synchronize", "host", {}, [&] { return target().synchronize(); });
  after_blocking(nullptr);
  return r;
}

// ---- compute ----------------------------------------------------------------------------

void TracingBackend::on_op(const OpInfo& op, const OpArgs& args, const Call& call) {
  if (op.repeat == 0) return void(timed(op.cost_name, "compute", args_json(args.tensors), call));
  const std::size_t fixed = op.traffic.size() - op.repeat;
  double bytes = 0;
  for (const Tensor* t : args.tensors)
    if (t->defined()) bytes += static_cast<double>(t->bytes());
  timed(op.cost_name, "compute",
        foreach_args_json(args.tensors.first(fixed), (args.tensors.size() - fixed) / op.repeat, bytes), call);
}
void TracingBackend::init_normal(Tensor& x, const NormalInitOp& op) {
  timed("init_normal", "compute", args_json({&x}), [&] { target().init_normal(x, op); });
}

// ---- communication ----------------------------------------------------------------------

void TracingBackend::all_reduce(Tensor& x, const Group& g, ReduceOp op) {
  collective("all_reduce", {&x}, static_cast<double>(x.bytes()), g,
             [&] { target().all_reduce(x, g, op); });
}
void TracingBackend::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) {
  collective("reduce_scatter", {&in, &out}, static_cast<double>(in.bytes()), g,
             [&] { target().reduce_scatter(in, out, g, op); });
}
void TracingBackend::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  collective("all_gather", {&in, &out}, static_cast<double>(out.bytes()), g,
             [&] { target().all_gather(in, out, g); });
}
void TracingBackend::all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) {
  collective("all_gather", {&in, &out}, fp8_gather_bytes(out.numel(), fp8_elements, out.dtype()), g,
             [&] { target().all_gather_fp8(in, out, g, fp8_elements); });
}
void TracingBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  collective("broadcast", {&x}, static_cast<double>(x.bytes()), g,
             [&] { target().broadcast(x, g, root_global_rank); });
}
template <class F>
void TracingBackend::exchange(const Tensor& in, std::span<const std::int64_t> send_counts, const Tensor& out,
                              const Group& g, double element, F&& call) {
  const std::int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  collective("all_to_all", {&in, &out}, static_cast<double>(sent) * element, g, std::forward<F>(call));
}
void TracingBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                                Tensor& out, std::span<const std::int64_t> recv_counts,
                                const Group& g) {
  exchange(in, send_counts, out, g, static_cast<double>(dtype_size(in.dtype())),
           [&] { target().all_to_all(in, send_counts, out, recv_counts, g); });
}
void TracingBackend::all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                                    std::span<const std::int64_t> recv_counts, const Group& g) {
  exchange(in, send_counts, out, g, 1.0, [&] { target().all_to_all_fp8(in, send_counts, out, recv_counts, g); });
}
void TracingBackend::send(const Tensor& x, int peer_global_rank, int tag) {
  timed("send", "send",
        args_json({&x}, -1, fmt::format(R"(,"peer":{},"tag":{})", peer_global_rank, tag)),
        [&] { target().send(x, peer_global_rank, tag); });
}
void TracingBackend::send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) {
  timed("send_recv", "send_recv",
        args_json({&out, &in}, -1, fmt::format(R"(,"to":{},"from":{},"tag":{})", to, from, tag)),
        [&] { target().send_recv(out, to, in, from, tag); });
}
void TracingBackend::recv(Tensor& x, int peer_global_rank, int tag) {
  timed("recv", "recv",
        args_json({&x}, -1, fmt::format(R"(,"peer":{},"tag":{})", peer_global_rank, tag)),
        [&] { target().recv(x, peer_global_rank, tag); });
}
void TracingBackend::barrier(const Group& g) {
  // The simulator times a barrier as a one-element all-reduce (NCCL has none).
  timed("all_reduce", "all_reduce",
        fmt::format(R"({{"shapes":[],"bytes":4,"group":{},"members":{},"barrier":true}})", g.id,
                    g.size()),
        [&] { target().barrier(g); });
}

}  // namespace meshtrain
