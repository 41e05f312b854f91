// BackendWrapper forwards every method to another Backend, so that a
// tracing, fault-injecting or recording backend overrides only what it
// changes (as leveldb's EnvWrapper). The wrapped backend must outlive the
// wrapper; the wrapper adds no state and no thread-safety of its own.
#pragma once

#include "backends/backend.h"

namespace meshtrain {

class BackendWrapper : public Backend {
 public:
  explicit BackendWrapper(Backend& target) : target_(target) {}
  Backend& target() const { return target_; }

  std::string_view name() const override { return target_.name(); }
  int rank() const override { return target_.rank(); }
  int world_size() const override { return target_.world_size(); }
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
  void fill(Tensor& x, float value) override { target_.fill(x, value); }
  void copy(const Tensor& src, Tensor& dst) override { target_.copy(src, dst); }
  void cast(const Tensor& src, Tensor& dst) override { target_.cast(src, dst); }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override { target_.add(a, b, out); }
  void scale(Tensor& x, float alpha) override { target_.scale(x, alpha); }
  void axpy(float alpha, const Tensor& x, Tensor& y) override { target_.axpy(alpha, x, y); }
  void sum(const Tensor& x, Tensor& out, float scale, bool accumulate) override {
    target_.sum(x, out, scale, accumulate);
  }
  void sum_squares(const Tensor& x, Tensor& out, bool accumulate) override {
    target_.sum_squares(x, out, accumulate);
  }
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    target_.gemm(a, b, c, op);
  }
  void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    target_.batched_gemm(a, b, c, op);
  }
  void bias_backward(const Tensor& dy, Tensor& db) override { target_.bias_backward(dy, db); }
  void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                         std::int64_t vocab_offset) override {
    target_.embedding_forward(table, ids, out, vocab_offset);
  }
  void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                          std::int64_t vocab_offset) override {
    target_.embedding_backward(dout, ids, dtable, vocab_offset);
  }
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                         Tensor& mean, Tensor& rstd, float eps) override {
    target_.layernorm_forward(x, weight, bias, out, mean, rstd, eps);
  }
  void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) override {
    target_.layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias);
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                       float eps) override {
    target_.rmsnorm_forward(x, weight, out, rstd, eps);
  }
  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight) override {
    target_.rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
  }
  void gelu_forward(const Tensor& x, Tensor& out) override { target_.gelu_forward(x, out); }
  void gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override {
    target_.gelu_backward(dout, x, dx);
  }
  void swiglu_forward(const Tensor& x, Tensor& out) override { target_.swiglu_forward(x, out); }
  void swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override {
    target_.swiglu_backward(dout, x, dx);
  }
  void dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) override {
    target_.dropout_forward(x, out, op);
  }
  void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) override {
    target_.dropout_backward(dout, dx, op);
  }
  void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) override {
    target_.gather_rows(src, index, out);
  }
  void moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& experts) override {
    target_.moe_route(logits, renormalize, probs, lse, weights, experts);
  }
  void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                          const Tensor& prob_grad, float z_scale, bool renormalize, Tensor& dlogits) override {
    target_.moe_route_backward(dweights, probs, lse, experts, prob_grad, z_scale, renormalize, dlogits);
  }
  void moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) override {
    target_.moe_combine(rows, index, weights, out);
  }
  void moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index, const Tensor& weights,
                            Tensor& drows, Tensor& dweights) override {
    target_.moe_combine_backward(dout, rows, index, weights, drows, dweights);
  }
  void rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
            std::int64_t first_position) override {
    target_.rope(x, heads_total, rotate_heads, theta, inverse, first_position);
  }
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                         const AttentionOp& op) override {
    target_.attention_forward(qkv, out, lse, op);
  }
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, Tensor& dqkv, const AttentionOp& op) override {
    target_.attention_backward(dout, qkv, out, lse, dqkv, op);
  }
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) override {
    target_.attention_merge(out, lse, part_out, part_lse);
  }
  void cross_entropy_max(const Tensor& logits, Tensor& row_max) override {
    target_.cross_entropy_max(logits, row_max);
  }
  void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              std::int64_t vocab_offset, Tensor& sumexp,
                              Tensor& target_logit) override {
    target_.cross_entropy_partials(logits, targets, row_max, vocab_offset, sumexp, target_logit);
  }
  void cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp, const Tensor& target_logit,
                          Tensor& losses) override {
    target_.cross_entropy_loss(row_max, sumexp, target_logit, losses);
  }
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              const Tensor& sumexp, std::int64_t vocab_offset, float dloss,
                              Tensor& dlogits) override {
    target_.cross_entropy_backward(logits, targets, row_max, sumexp, vocab_offset, dloss, dlogits);
  }
  void cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                              bool accumulate) override {
    target_.cross_entropy_accuracy(row_max, target_logit, correct, accumulate);
  }
  void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) override {
    target_.clip_coefficient(sumsq, max_norm, coef);
  }
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
             const AdamWOp& op) override {
    target_.adamw(param, grad, m, v, coef, op);
  }
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) override {
    target_.foreach_sum_squares(xs, out);
  }
  void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                     const AdamWOp& op) override {
    target_.foreach_adamw(params, coef, op);
  }
  void sign_compress(const Tensor& x, Tensor& error, Tensor& packets) override {
    target_.sign_compress(x, error, packets);
  }
  void sign_decompress(const Tensor& packets, Tensor& out) override { target_.sign_decompress(packets, out); }
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

 private:
  Backend& target_;
};

}  // namespace meshtrain
