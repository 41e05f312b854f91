#include "engine/tracing/tracing_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

namespace meshtrain {

namespace {

// {"shapes":["(4, 32)",null,...],"bytes":N<extra>}; an undefined optional
// tensor (a missing bias, no clip coefficient) is null. `bytes` < 0: the sum of
// the defined tensors' bytes.
std::string args_json(std::initializer_list<const Tensor*> tensors, double bytes = -1,
                      const std::string& extra = {}) {
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

// The same for the tensors of a multi-tensor op: the shape of `out` only, and
// "tensors": how many the op covers, the bytes of all of them.
std::string foreach_args_json(std::size_t tensors, double bytes, const Tensor* out) {
  return fmt::format(R"({{"shapes":[{}],"bytes":{:.0f},"tensors":{}}})",
                     out != nullptr && out->defined() ? '"' + out->shape().str() + '"' : "null", bytes,
                     tensors);
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
auto TracingBackend::timed(const char* name, const char* category, std::string args, F&& call) {
  const Stream s = target().current_stream();
  TraceEvent e{s.id, name, category, 0, 0};
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
void TracingBackend::compute(const char* name, std::initializer_list<const Tensor*> tensors,
                             F&& call) {
  timed(name, "compute", args_json(tensors), std::forward<F>(call));
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

void TracingBackend::fill(Tensor& x, float value) {
  compute("fill", {&x}, [&] { target().fill(x, value); });
}
void TracingBackend::copy(const Tensor& src, Tensor& dst) {
  compute("copy", {&src, &dst}, [&] { target().copy(src, dst); });
}
void TracingBackend::cast(const Tensor& src, Tensor& dst) {
  compute("cast", {&src, &dst}, [&] { target().cast(src, dst); });
}
void TracingBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  compute("add", {&a, &b, &out}, [&] { target().add(a, b, out); });
}
void TracingBackend::scale(Tensor& x, float alpha) {
  compute("scale", {&x}, [&] { target().scale(x, alpha); });
}
void TracingBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  compute("axpy", {&x, &y}, [&] { target().axpy(alpha, x, y); });
}
void TracingBackend::sum(const Tensor& x, Tensor& out, float scale, bool accumulate) {
  compute("sum", {&x, &out}, [&] { target().sum(x, out, scale, accumulate); });
}
void TracingBackend::sum_squares(const Tensor& x, Tensor& out, bool accumulate) {
  compute("sum_squares", {&x, &out}, [&] { target().sum_squares(x, out, accumulate); });
}
void TracingBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  compute("gemm", {&a, &b, &c, &op.bias}, [&] { target().gemm(a, b, c, op); });
}
void TracingBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  compute("batched_gemm", {&a, &b, &c, &op.bias}, [&] { target().batched_gemm(a, b, c, op); });
}
void TracingBackend::bias_backward(const Tensor& dy, Tensor& db) {
  compute("bias_backward", {&dy, &db}, [&] { target().bias_backward(dy, db); });
}
void TracingBackend::embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                       std::int64_t vocab_offset) {
  compute("embedding_forward", {&table, &ids, &out},
          [&] { target().embedding_forward(table, ids, out, vocab_offset); });
}
void TracingBackend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                        std::int64_t vocab_offset) {
  compute("embedding_backward", {&dout, &ids, &dtable},
          [&] { target().embedding_backward(dout, ids, dtable, vocab_offset); });
}
void TracingBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       Tensor& out, Tensor& mean, Tensor& rstd, float eps) {
  compute("layernorm_forward", {&x, &weight, &bias, &out, &mean, &rstd},
          [&] { target().layernorm_forward(x, weight, bias, out, mean, rstd, eps); });
}
void TracingBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                        Tensor& dweight, Tensor& dbias) {
  compute("layernorm_backward", {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias},
          [&] { target().layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias); });
}
void TracingBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out,
                                     Tensor& rstd, float eps) {
  compute("rmsnorm_forward", {&x, &weight, &out, &rstd},
          [&] { target().rmsnorm_forward(x, weight, out, rstd, eps); });
}
void TracingBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                      const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  compute("rmsnorm_backward", {&dout, &x, &weight, &rstd, &dx, &dweight},
          [&] { target().rmsnorm_backward(dout, x, weight, rstd, dx, dweight); });
}
void TracingBackend::gelu_forward(const Tensor& x, Tensor& out) {
  compute("gelu_forward", {&x, &out}, [&] { target().gelu_forward(x, out); });
}
void TracingBackend::gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  compute("gelu_backward", {&dout, &x, &dx}, [&] { target().gelu_backward(dout, x, dx); });
}
void TracingBackend::swiglu_forward(const Tensor& x, Tensor& out) {
  compute("swiglu_forward", {&x, &out}, [&] { target().swiglu_forward(x, out); });
}
void TracingBackend::swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  compute("swiglu_backward", {&dout, &x, &dx}, [&] { target().swiglu_backward(dout, x, dx); });
}
void TracingBackend::dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) {
  compute("dropout_forward", {&x, &out}, [&] { target().dropout_forward(x, out, op); });
}
void TracingBackend::dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) {
  compute("dropout_backward", {&dout, &dx}, [&] { target().dropout_backward(dout, dx, op); });
}
void TracingBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  compute("gather_rows", {&src, &index, &out}, [&] { target().gather_rows(src, index, out); });
}
void TracingBackend::moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                               Tensor& experts) {
  compute("moe_route", {&logits, &probs, &lse, &weights, &experts},
          [&] { target().moe_route(logits, renormalize, probs, lse, weights, experts); });
}
void TracingBackend::moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                                        const Tensor& experts, const Tensor& prob_grad, float z_scale,
                                        bool renormalize, Tensor& dlogits) {
  compute("moe_route_backward", {&dweights, &probs, &lse, &experts, &prob_grad, &dlogits}, [&] {
    target().moe_route_backward(dweights, probs, lse, experts, prob_grad, z_scale, renormalize, dlogits);
  });
}
void TracingBackend::moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) {
  compute("moe_combine", {&rows, &index, &weights, &out}, [&] { target().moe_combine(rows, index, weights, out); });
}
void TracingBackend::moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index,
                                          const Tensor& weights, Tensor& drows, Tensor& dweights) {
  compute("moe_combine_backward", {&dout, &rows, &index, &weights, &drows, &dweights},
          [&] { target().moe_combine_backward(dout, rows, index, weights, drows, dweights); });
}
void TracingBackend::rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
                          std::int64_t first_position) {
  compute("rope", {&x}, [&] { target().rope(x, heads_total, rotate_heads, theta, inverse, first_position); });
}
void TracingBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                       const AttentionOp& op) {
  compute("attention_forward", {&qkv, &out, &lse},
          [&] { target().attention_forward(qkv, out, lse, op); });
}
void TracingBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse, Tensor& dqkv, const AttentionOp& op) {
  compute("attention_backward", {&dout, &qkv, &out, &lse, &dqkv},
          [&] { target().attention_backward(dout, qkv, out, lse, dqkv, op); });
}
void TracingBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) {
  compute("attention_merge", {&out, &lse, &part_out, &part_lse},
          [&] { target().attention_merge(out, lse, part_out, part_lse); });
}
void TracingBackend::cross_entropy_max(const Tensor& logits, Tensor& row_max) {
  compute("cross_entropy_max", {&logits, &row_max},
          [&] { target().cross_entropy_max(logits, row_max); });
}
void TracingBackend::cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                            const Tensor& row_max, std::int64_t vocab_offset,
                                            Tensor& sumexp, Tensor& target_logit) {
  compute("cross_entropy_partials", {&logits, &targets, &row_max, &sumexp, &target_logit}, [&] {
    target().cross_entropy_partials(logits, targets, row_max, vocab_offset, sumexp, target_logit);
  });
}
void TracingBackend::cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                        const Tensor& target_logit, Tensor& losses) {
  compute("cross_entropy_loss", {&row_max, &sumexp, &target_logit, &losses},
          [&] { target().cross_entropy_loss(row_max, sumexp, target_logit, losses); });
}
void TracingBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& row_max, const Tensor& sumexp,
                                            std::int64_t vocab_offset, float dloss,
                                            Tensor& dlogits) {
  compute("cross_entropy_backward", {&logits, &targets, &row_max, &sumexp, &dlogits}, [&] {
    target().cross_entropy_backward(logits, targets, row_max, sumexp, vocab_offset, dloss, dlogits);
  });
}
void TracingBackend::cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                                            bool accumulate) {
  compute("cross_entropy_accuracy", {&row_max, &target_logit, &correct},
          [&] { target().cross_entropy_accuracy(row_max, target_logit, correct, accumulate); });
}
void TracingBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) {
  compute("clip_coefficient", {&sumsq, &coef},
          [&] { target().clip_coefficient(sumsq, max_norm, coef); });
}
void TracingBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const Tensor& coef, const AdamWOp& op) {
  compute("adamw", {&param, &grad, &m, &v, &coef},
          [&] { target().adamw(param, grad, m, v, coef, op); });
}

void TracingBackend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  double bytes = static_cast<double>(out.bytes());
  for (const Tensor& x : xs) bytes += static_cast<double>(x.bytes());
  timed("sum_squares", "compute", foreach_args_json(xs.size(), bytes, &out),
        [&] { target().foreach_sum_squares(xs, out); });
}
void TracingBackend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                                   const AdamWOp& op) {
  double bytes = coef.defined() ? static_cast<double>(coef.bytes()) : 0.0;
  for (const AdamWTensors& t : params)
    bytes += static_cast<double>(t.param.bytes() + t.grad.bytes() + t.m.bytes() + t.v.bytes());
  timed("adamw", "compute", foreach_args_json(params.size(), bytes, nullptr),
        [&] { target().foreach_adamw(params, coef, op); });
}
void TracingBackend::sign_compress(const Tensor& x, Tensor& error, Tensor& packets) {
  compute("sign_compress", {&x, &error, &error, &packets}, [&] { target().sign_compress(x, error, packets); });
}
void TracingBackend::sign_decompress(const Tensor& packets, Tensor& out) {
  compute("sign_decompress", {&packets, &out}, [&] { target().sign_decompress(packets, out); });
}
void TracingBackend::init_normal(Tensor& x, const NormalInitOp& op) {
  compute("init_normal", {&x}, [&] { target().init_normal(x, op); });
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
void TracingBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  collective("broadcast", {&x}, static_cast<double>(x.bytes()), g,
             [&] { target().broadcast(x, g, root_global_rank); });
}
void TracingBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                                Tensor& out, std::span<const std::int64_t> recv_counts,
                                const Group& g) {
  const std::int64_t sent =
      std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  collective("all_to_all", {&in, &out},
             static_cast<double>(sent) * static_cast<double>(dtype_size(in.dtype())), g,
             [&] { target().all_to_all(in, send_counts, out, recv_counts, g); });
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
