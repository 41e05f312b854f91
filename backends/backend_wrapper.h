// BackendWrapper forwards every method to another Backend, so that a
// tracing, fault-injecting or recording backend overrides only what it
// changes (as leveldb's EnvWrapper). The wrapped backend must outlive the
// wrapper; the wrapper adds no state and no thread-safety of its own.
//
// Every compute op of the op table (backends/op_table.h) goes through one
// hook, on_op(entry, operands, call), whose default just makes the call: a
// wrapper that times, traces or records every op (engine/calibrate/
// op_profile.h, engine/tracing/tracing_backend.h, engine/calibrate/
// workload_shapes.cc) overrides that hook instead of one method per op, and
// this file is the only list of them. Operands go in the entry's order; the
// multi-tensor ops pass their fixed operands, then each group's.
// grouped_gemm is left to Backend's default: wrappers see one gemm per
// group. Communication, host transfers, init_normal and streams are
// forwarded without the hook.
#pragma once

#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "backends/backend.h"
#include "backends/op_table.h"

namespace meshtrain {

class BackendWrapper : public Backend {
 public:
  explicit BackendWrapper(Backend& target) : target_(target) {}
  Backend& target() const { return target_; }

  // The call an on_op override must make exactly once: the op on the wrapped backend.
  class Call {
   public:
    template <class F>
    explicit Call(F& f) : f_(&f), run_([](void* p) { (*static_cast<F*>(p))(); }) {}
    void operator()() const { run_(f_); }

   private:
    void* f_;
    void (*run_)(void*);
  };


  std::string_view name() const override { return target_.name(); }
  int rank() const override { return target_.rank(); }
  int world_size() const override { return target_.world_size(); }
  bool holds_values() const override { return target_.holds_values(); }
  Tensor empty(const Shape& shape, DType dtype = DType::f32) override {
    return target_.empty(shape, dtype);
  }
  Tensor zeros(const Shape& shape, DType dtype = DType::f32) override {
    return target_.zeros(shape, dtype);
  }
  Tensor host_zeros(const Shape& shape, DType dtype = DType::f32) override {
    return target_.host_zeros(shape, dtype);
  }
  MemoryStats memory_stats() const override { return target_.memory_stats(); }
  void reset_peak() override { target_.reset_peak(); }
  void write(Tensor& dst, std::span<const float> host) override { target_.write(dst, host); }
  void write(Tensor& dst, std::span<const std::int32_t> host) override { target_.write(dst, host); }
  Status read(const Tensor& src, std::span<float> host) override { return target_.read(src, host); }
  Stream create_stream(std::string_view name) override { return target_.create_stream(name); }
  void set_stream(Stream s) override { target_.set_stream(s); }
  Stream current_stream() const override { return target_.current_stream(); }
  Event record(Stream s) override { return target_.record(s); }
  void wait(Stream s, Event e) override { target_.wait(s, e); }
  Status synchronize() override { return target_.synchronize(); }
  std::string set_region(std::string name) override { return target_.set_region(std::move(name)); }
  void init_normal(Tensor& x, const NormalInitOp& op) override { target_.init_normal(x, op); }
  Event timed_event(Stream s) override { return target_.timed_event(s); }
  Result<double> seconds_between(Event start, Event end) override {
    return target_.seconds_between(start, end);
  }
  void fill(Tensor& x, float v) override {
    see("fill", {&x}, [&] { target().fill(x, v); });
  }
  void copy(const Tensor& s, Tensor& d) override {
    see("copy", {&s, &d}, [&] { target().copy(s, d); });
  }
  void cast(const Tensor& s, Tensor& d) override {
    see("cast", {&s, &d}, [&] { target().cast(s, d); });
  }
  void add(const Tensor& a, const Tensor& b, Tensor& o) override {
    see("add", {&a, &b, &o}, [&] { target().add(a, b, o); });
  }
  void scale(Tensor& x, float a) override {
    see("scale", {&x}, [&] { target().scale(x, a); });
  }
  void axpy(float a, const Tensor& x, Tensor& y) override {
    see("axpy", {&x, &y}, [&] { target().axpy(a, x, y); });
  }
  void sum(const Tensor& x, Tensor& o, float s, bool acc) override {
    see("sum", {&x, &o}, [&] { target().sum(x, o, s, acc); });
  }
  void sum_squares(const Tensor& x, Tensor& o, bool acc) override {
    see("sum_squares", {&x, &o}, [&] { target().sum_squares(x, o, acc); });
  }
  void fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) override;
  void amax(const Tensor& x, Tensor& o) override {
    see("amax", {&x, &o}, [&] { target().amax(x, o); });
  }
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    OpArgs args;
    args.gemm = &op;
    see(
        "gemm", {&a, &b, &c, &op.bias}, [&] { target().gemm(a, b, c, op); }, args);
  }
  void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    OpArgs args;
    args.gemm = &op;
    see(
        "batched_gemm", {&a, &b, &c, &op.bias}, [&] { target().batched_gemm(a, b, c, op); }, args);
  }
  void bias_backward(const Tensor& dy, Tensor& db) override {
    see("bias_backward", {&dy, &db}, [&] { target().bias_backward(dy, db); });
  }
  void embedding_forward(const Tensor& t, const Tensor& ids, Tensor& o, std::int64_t off) override {
    see("embedding_forward", {&t, &ids, &o}, [&] { target().embedding_forward(t, ids, o, off); });
  }
  void embedding_backward(const Tensor& d, const Tensor& ids, Tensor& dt, std::int64_t off) override {
    see("embedding_backward", {&d, &ids, &dt}, [&] { target().embedding_backward(d, ids, dt, off); });
  }
  void gather_rows(const Tensor& s, const Tensor& i, Tensor& o) override {
    see("gather_rows", {&s, &i, &o}, [&] { target().gather_rows(s, i, o); });
  }
  void moe_route(const Tensor& l, bool r, Tensor& p, Tensor& lse, Tensor& w, Tensor& e) override {
    see("moe_route", {&l, &p, &lse, &w, &e}, [&] { target().moe_route(l, r, p, lse, w, e); });
  }
  void moe_route_backward(const Tensor& dw, const Tensor& p, const Tensor& lse, const Tensor& e, const Tensor& g,
                          float z, bool r, Tensor& dl) override {
    see("moe_route_backward", {&dw, &p, &lse, &e, &g, &dl},
        [&] { target().moe_route_backward(dw, p, lse, e, g, z, r, dl); });
  }
  void moe_combine(const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& o) override {
    see("moe_combine", {&rows, &i, &w, &o}, [&] { target().moe_combine(rows, i, w, o); });
  }
  void moe_combine_backward(const Tensor& d, const Tensor& rows, const Tensor& i, const Tensor& w, Tensor& dr,
                            Tensor& dw) override {
    see("moe_combine_backward", {&d, &rows, &i, &w, &dr, &dw},
        [&] { target().moe_combine_backward(d, rows, i, w, dr, dw); });
  }
  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& o, Tensor& m, Tensor& r,
                         float eps) override {
    see("layernorm_forward", {&x, &w, &b, &o, &m, &r}, [&] { target().layernorm_forward(x, w, b, o, m, r, eps); });
  }
  void layernorm_backward(const Tensor& d, const Tensor& x, const Tensor& w, const Tensor& m, const Tensor& r,
                          Tensor& dx, Tensor& dw, Tensor& db) override {
    see("layernorm_backward", {&d, &x, &w, &m, &r, &dx, &dw, &db},
        [&] { target().layernorm_backward(d, x, w, m, r, dx, dw, db); });
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& o, Tensor& r, float eps) override {
    see("rmsnorm_forward", {&x, &w, &o, &r}, [&] { target().rmsnorm_forward(x, w, o, r, eps); });
  }
  void rmsnorm_backward(const Tensor& d, const Tensor& x, const Tensor& w, const Tensor& r, Tensor& dx,
                        Tensor& dw) override {
    see("rmsnorm_backward", {&d, &x, &w, &r, &dx, &dw}, [&] { target().rmsnorm_backward(d, x, w, r, dx, dw); });
  }
  void gelu_forward(const Tensor& x, Tensor& o) override {
    see("gelu_forward", {&x, &o}, [&] { target().gelu_forward(x, o); });
  }
  void gelu_backward(const Tensor& d, const Tensor& x, Tensor& dx) override {
    see("gelu_backward", {&d, &x, &dx}, [&] { target().gelu_backward(d, x, dx); });
  }
  void swiglu_forward(const Tensor& x, Tensor& o) override {
    see("swiglu_forward", {&x, &o}, [&] { target().swiglu_forward(x, o); });
  }
  void swiglu_backward(const Tensor& d, const Tensor& x, Tensor& dx) override {
    see("swiglu_backward", {&d, &x, &dx}, [&] { target().swiglu_backward(d, x, dx); });
  }
  void dropout_forward(const Tensor& x, Tensor& o, const DropoutOp& op) override {
    see("dropout_forward", {&x, &o}, [&] { target().dropout_forward(x, o, op); });
  }
  void dropout_backward(const Tensor& d, Tensor& dx, const DropoutOp& op) override {
    see("dropout_backward", {&d, &dx}, [&] { target().dropout_backward(d, dx, op); });
  }
  void rope(Tensor& x, int total, int rotate, float theta, bool inverse, std::int64_t first) override;
  void attention_forward(const Tensor& qkv, Tensor& o, Tensor& lse, const AttentionOp& op) override {
    OpArgs args;
    args.attention = &op;
    see(
        "attention_forward", {&qkv, &o, &lse}, [&] { target().attention_forward(qkv, o, lse, op); }, args);
  }
  void attention_backward(const Tensor& d, const Tensor& qkv, const Tensor& o, const Tensor& lse, Tensor& dqkv,
                          const AttentionOp& op) override {
    OpArgs args;
    args.attention = &op;
    see(
        "attention_backward", {&d, &qkv, &o, &lse, &dqkv},
        [&] { target().attention_backward(d, qkv, o, lse, dqkv, op); }, args);
  }
  void attention_merge(Tensor& o, Tensor& lse, const Tensor& po, const Tensor& pl) override {
    see("attention_merge", {&o, &lse, &po, &pl}, [&] { target().attention_merge(o, lse, po, pl); });
  }
  void cross_entropy_max(const Tensor& l, Tensor& m) override {
    see("cross_entropy_max", {&l, &m}, [&] { target().cross_entropy_max(l, m); });
  }
  void cross_entropy_partials(const Tensor& l, const Tensor& t, const Tensor& m, std::int64_t off, Tensor& s,
                              Tensor& tl) override {
    see("cross_entropy_partials", {&l, &t, &m, &s, &tl}, [&] { target().cross_entropy_partials(l, t, m, off, s, tl); });
  }
  void cross_entropy_loss(const Tensor& m, const Tensor& s, const Tensor& tl, Tensor& l) override {
    see("cross_entropy_loss", {&m, &s, &tl, &l}, [&] { target().cross_entropy_loss(m, s, tl, l); });
  }
  void cross_entropy_backward(const Tensor& l, const Tensor& t, const Tensor& m, const Tensor& s, std::int64_t off,
                              float d, Tensor& dl) override {
    see("cross_entropy_backward", {&l, &t, &m, &s, &dl},
        [&] { target().cross_entropy_backward(l, t, m, s, off, d, dl); });
  }
  void cross_entropy_accuracy(const Tensor& m, const Tensor& tl, Tensor& c, bool acc) override {
    see("cross_entropy_accuracy", {&m, &tl, &c}, [&] { target().cross_entropy_accuracy(m, tl, c, acc); });
  }
  void clip_coefficient(const Tensor& s, float n, Tensor& c) override {
    see("clip_coefficient", {&s, &c}, [&] { target().clip_coefficient(s, n, c); });
  }
  void adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const Tensor& c, const AdamWOp& op) override {
    see("adamw", {&p, &g, &m, &v, &c}, [&] { target().adamw(p, g, m, v, c, op); });
  }
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) override;
  void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp& op) override;
  void sign_compress(const Tensor& x, Tensor& e, Tensor& p) override {
    see("sign_compress", {&x, &e, &p}, [&] { target().sign_compress(x, e, p); });
  }
  void sign_decompress(const Tensor& p, Tensor& o) override {
    see("sign_decompress", {&p, &o}, [&] { target().sign_decompress(p, o); });
  }

  void all_reduce(Tensor& x, const Group& g, ReduceOp op) override { target_.all_reduce(x, g, op); }
  void reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) override {
    target_.reduce_scatter(in, out, g, op);
  }
  void all_gather(const Tensor& in, Tensor& out, const Group& g) override {
    target_.all_gather(in, out, g);
  }
  void broadcast(Tensor& x, const Group& g, int root_global_rank) override {
    target_.broadcast(x, g, root_global_rank);
  }
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                  std::span<const std::int64_t> recv_counts, const Group& g) override {
    target_.all_to_all(in, send_counts, out, recv_counts, g);
  }
  // Straight to the target: a wrapper that times or counts FP8 gathers too
  // overrides these two as well as all_gather and all_to_all (tracing, step timing).
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override {
    target_.all_gather_fp8(in, out, g, fp8_elements);
  }
  void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                      std::span<const std::int64_t> recv_counts, const Group& g) override {
    target_.all_to_all_fp8(in, send_counts, out, recv_counts, g);
  }
  void send(const Tensor& x, int peer_global_rank, int tag) override {
    target_.send(x, peer_global_rank, tag);
  }
  void recv(Tensor& x, int peer_global_rank, int tag) override {
    target_.recv(x, peer_global_rank, tag);
  }
  void send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) override {
    target_.send_recv(out, to, in, from, tag);
  }
  void barrier(const Group& g) override { target_.barrier(g); }

 protected:
  // Called for every observed op; must run `call` once. The default runs it.
  virtual void on_op(const OpInfo& op, const OpArgs& args, const Call& call) {
    (void)op, (void)args;
    call();
  }

 private:
  Backend& target_;
  template <class F>
  void see(std::string_view name, std::initializer_list<const Tensor*> tensors, F&& f, OpArgs args = {}) {
    static_assert(std::is_invocable_v<F&>);
    args.tensors = std::span<const Tensor* const>(tensors.begin(), tensors.size());
    on_op(op_info(name), args, Call(f));
  }
};

}  // namespace meshtrain
