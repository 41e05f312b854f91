// TracingBackend: a BackendWrapper that times every op of the backend it
// wraps and hands the events to a TraceRecorder (trace_recorder.h), for
// `meshtrain train --trace FILE`.
//
// What a duration means depends on the wrapped backend.
//  * A backend with device timing (Backend::timed_event gives a valid Event:
//    cuda): the op's time ON THE DEVICE. A timing event goes on the op's
//    stream before and after it, and the event's "ts" and "dur" are the
//    device's: seconds from a base timing event of that stream, placed on the
//    host clock where the base was issued (right after a blocking call, when
//    the stream is idle, so the device reached it then; on a stream's first
//    op otherwise). Such an event carries "clock":"device" in its args. This
//    holds for compute ops, collectives and send/recv; write, read and
//    synchronize are host calls and keep host time.
//    Tracing adds no wait: the pairs are read back (seconds_between) only
//    where the host already waits. After a read on stream s, the pairs of s
//    issued before it (the read waited for them) and those of other streams
//    issued before the previous blocking call (the engine's streams join at
//    least once per step, so they have finished); after synchronize and at
//    destruction, all of them. A run with no blocking call for 4096 traced
//    ops reads its oldest 2048 (long finished; the backend keeps only the
//    last 16384 timing events). A pair that cannot be read keeps the host
//    times below, and the destructor warns how many did so.
//  * A backend without it (cpu, sim): the host wall time of the inner call.
//    The cpu backend runs ops eagerly on the issuing thread, so that is the
//    op's run time, and a collective's or recv's includes the wait for its
//    peers.
//
// Traced: every compute op (category "compute"; the multi-tensor ops under
// the name of the op they repeat, as the simulator names them, with
// "tensors": their count), write / read / synchronize
// ("host"), collectives (name and category as the simulator's:
// "all_reduce", ...; a barrier is the one-element all_reduce the simulator
// times it as, with "barrier": true in its args) and send / recv. Untraced,
// because they take no time of their own: empty, memory_stats, streams
// (create_stream only names the track), record and wait.
//
// Args of each event: "shapes", the shapes of its tensor arguments in
// signature order, and "bytes": for compute and host ops the bytes of those
// tensors, for collectives the nccl-tests size the simulator uses (all_reduce
// and broadcast the buffer, reduce_scatter its input, all_gather its output,
// all_to_all the bytes sent), for send/recv the message; collectives add
// "group" and "members", point to point "peer" and "tag".
//
// Threads: like any Backend, one host thread issues on it; its events stay in
// a buffer of its own until destruction, when they go to the recorder in one
// locked hand-over. So the recorder must outlive the TracingBackend, and the
// trace is complete once every rank's TracingBackend is destroyed.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "backends/backend_wrapper.h"
#include "engine/tracing/trace_recorder.h"

namespace meshtrain {

class TracingBackend final : public BackendWrapper {
 public:
  TracingBackend(Backend& target, TraceRecorder& recorder);
  ~TracingBackend() override;  // hands the events to the recorder
  TracingBackend(const TracingBackend&) = delete;
  TracingBackend& operator=(const TracingBackend&) = delete;

  void write(Tensor& dst, std::span<const float> host) override;
  void write(Tensor& dst, std::span<const std::int32_t> host) override;
  Status read(const Tensor& src, std::span<float> host) override;
  Stream create_stream(std::string_view name) override;
  Status synchronize() override;
  // Counted (the backend's ring of timing events is shared with the wrappers above), not traced.
  Event timed_event(Stream s) override;

  void fill(Tensor& x, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(Tensor& x, float alpha) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void sum(const Tensor& x, Tensor& out, float scale, bool accumulate) override;
  void sum_squares(const Tensor& x, Tensor& out, bool accumulate) override;
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;
  void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                         std::int64_t vocab_offset) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                          std::int64_t vocab_offset) override;
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                         Tensor& mean, Tensor& rstd, float eps) override;
  void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                       float eps) override;
  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight) override;
  void gelu_forward(const Tensor& x, Tensor& out) override;
  void gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override;
  void swiglu_forward(const Tensor& x, Tensor& out) override;
  void swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) override;
  void dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) override;
  void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) override;
  void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) override;
  void moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& experts) override;
  void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                          const Tensor& prob_grad, float z_scale, bool renormalize, Tensor& dlogits) override;
  void moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) override;
  void moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index, const Tensor& weights,
                            Tensor& drows, Tensor& dweights) override;
  void rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
            std::int64_t first_position) override;
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                         const AttentionOp& op) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, Tensor& dqkv, const AttentionOp& op) override;
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) override;
  void cross_entropy_max(const Tensor& logits, Tensor& row_max) override;
  void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              std::int64_t vocab_offset, Tensor& sumexp,
                              Tensor& target_logit) override;
  void cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp, const Tensor& target_logit,
                          Tensor& losses) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              const Tensor& sumexp, std::int64_t vocab_offset, float dloss,
                              Tensor& dlogits) override;
  void cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                              bool accumulate) override;
  void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) override;
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
             const AdamWOp& op) override;
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) override;
  void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                     const AdamWOp& op) override;
  void sign_compress(const Tensor& x, Tensor& error, Tensor& packets) override;
  void sign_decompress(const Tensor& packets, Tensor& out) override;
  void init_normal(Tensor& x, const NormalInitOp& op) override;
  void all_reduce(Tensor& x, const Group& g, ReduceOp op) override;
  void reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor& out, const Group& g) override;
  void broadcast(Tensor& x, const Group& g, int root_global_rank) override;
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                  std::span<const std::int64_t> recv_counts, const Group& g) override;
  void send(const Tensor& x, int peer_global_rank, int tag) override;
  void recv(Tensor& x, int peer_global_rank, int tag) override;
  void send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) override;
  void barrier(const Group& g) override;

 private:
  // Runs `call`, recording it as `name` in `category` on the current stream.
  template <class F>
  auto timed(const char* name, const char* category, std::string args, F&& call);
  template <class F>
  void compute(const char* name, std::initializer_list<const Tensor*> tensors, F&& call);
  template <class F>
  void collective(const char* name, std::initializer_list<const Tensor*> tensors, double bytes,
                  const Group& g, F&& call);

  // Device timing (see above). A base: a timing event of one stream and the
  // host time it was issued at.
  struct Base {
    Event event;
    std::int64_t host_ns = 0;
    std::int64_t issued = 0;  // timed_events_ when it was issued
  };
  // trace_.events[index] timed on the device from `start` to `end` on `stream`.
  struct Pending {
    std::size_t index;
    int stream;
    Base base;
    Event start, end;
  };
  Event mark(Stream s);           // a timing event on `s`, counted
  const Base& base_for(Stream s);  // the stream's base, issued now if it has none or an old one
  // After a blocking call that waited for stream `waited` (null: for all of them): reads back what has
  // finished and gives the idle streams new bases.
  void after_blocking(const Stream* waited);
  void resolve(const Pending& p);
  void resolve_oldest(std::size_t count);

  TraceRecorder& recorder_;
  RankTrace trace_;
  bool device_ = false;
  std::int64_t timed_events_ = 0;
  std::map<int, Base> bases_;     // by stream id
  std::vector<Pending> pending_;  // issue order
  std::size_t before_last_block_ = 0;  // pending_[0, this) were issued before the last blocking call
  std::int64_t unread_ = 0;            // pairs that could not be read back
  std::string first_unread_error_;
};

}  // namespace meshtrain
