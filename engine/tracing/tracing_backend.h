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
// Traced: every compute op of the op table (backends/op_table.h; category
// "compute", under its cost name: the multi-tensor ops under the name of the
// op they repeat, as the simulator names them, with "tensors": their count)
// and init_normal, write / read / synchronize
// ("host"), collectives (name and category as the simulator's:
// "all_reduce", ...; a barrier is the one-element all_reduce the simulator
// times it as, with "barrier": true in its args) and send / recv. Untraced,
// because they take no time of their own: empty, memory_stats, streams
// (create_stream only names the track), record and wait.
//
// Args of each event: "shapes", the shapes of its tensor arguments in
// the table's operand order (a multi-tensor op: its fixed operands only),
// and "bytes": for compute and host ops the bytes of those
// tensors, for collectives the nccl-tests size the simulator uses (all_reduce
// and broadcast the buffer, reduce_scatter its input, all_gather its output,
// all_to_all the bytes sent; the FP8 variants at one byte an element, as
// Transformer Engine moves them, whatever this backend moves), for send/recv the message; collectives add
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

  void init_normal(Tensor& x, const NormalInitOp& op) override;
  #include "backends/collective_overrides.inc"
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override;
  void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                      std::span<const std::int64_t> recv_counts, const Group& g) override;
  void send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) override;

 private:
  // Every compute op of the op table, under its cost name.
  void on_op(const OpInfo& op, const OpArgs& args, const Call& call) override;
  // Runs `call`, recording it as `name` in `category` on the current stream.
  template <class F>
  auto timed(std::string_view name, const char* category, std::string args, F&& call);
  template <class F>
  void collective(const char* name, std::initializer_list<const Tensor*> tensors, double bytes,
                  const Group& g, F&& call);
  // An all_to_all: its bytes sent, at `element` bytes an element.
  template <class F>
  void exchange(const Tensor& in, std::span<const std::int64_t> send_counts, const Tensor& out, const Group& g,
                double element, F&& call);

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
