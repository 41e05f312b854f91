#include "engine/training/step_timing.h"

#include <algorithm>
#include <map>

namespace meshtrain {

void StepTimer::begin_step() {
  in_step_ = true;
  step_start_ = mark_ = Clock::now();
  host_comm_s_ = 0;
  // device_comms_ keeps the previous step's communication that its end_step left unread.
  device_comm_s_ = device_on_compute_s_ = 0;
  device_error_.reset();
  compute_stream_ = current_stream();
  device_start_ = target().timed_event(compute_stream_);
  device_ = device_start_.valid();
}

template <class Op>
void StepTimer::communicate(Op&& op) {
  if (!in_step_) return op();
  if (hook_) hook_(std::chrono::duration<double>(Clock::now() - mark_).count());
  const Stream s = current_stream();
  const Event start = device_ ? target().timed_event(s) : Event{};
  const auto t0 = Clock::now();
  op();
  mark_ = Clock::now();
  if (device_) {
    device_comms_.push_back({start, target().timed_event(s), s == compute_stream_});
    // A safety valve for a step with thousands of collectives and no blocking call: the oldest
    // are long finished, and the backend keeps only the last 16384 timing events.
    if (device_comms_.size() >= 4096) read_device_comms(2048);
  } else {
    host_comm_s_ += std::chrono::duration<double>(mark_ - t0).count();
  }
}

void StepTimer::read_device_comms(std::size_t count) {
  count = std::min(count, device_comms_.size());
  for (std::size_t i = 0; i < count; ++i) {
    const DeviceComm& c = device_comms_[i];
    auto s = target().seconds_between(c.start, c.end);
    if (!s.ok()) {
      if (!device_error_) device_error_ = s.error();
      continue;
    }
    device_comm_s_ += *s;
    if (c.on_compute_stream) device_on_compute_s_ += *s;
  }
  device_comms_.erase(device_comms_.begin(), device_comms_.begin() + static_cast<std::ptrdiff_t>(count));
  settled_ -= std::min(settled_, count);
}

Status StepTimer::read(const Tensor& src, std::span<float> host) {
  Status s = target().read(src, host);
  settled_ = device_comms_.size();
  return s;
}

Status StepTimer::synchronize() {
  Status s = target().synchronize();
  settled_ = device_comms_.size();
  return s;
}

Result<RankTiming> StepTimer::end_step() {
  in_step_ = false;
  RankTiming t;
  t.step_s = std::chrono::duration<double>(Clock::now() - step_start_).count();
  if (!device_) {
    t.comm_s = host_comm_s_;
    t.compute_s = std::max(0.0, t.step_s - t.comm_s);
    return t;
  }
  // The step ended with a blocking read (the loss), so its host time spans
  // its device work; what came after that read is read after the next one.
  read_device_comms(settled_);
  if (device_error_) return *device_error_;
  t.comm_s = device_comm_s_;
  t.compute_s = std::max(0.0, t.step_s - device_on_compute_s_);
  return t;
}

void StepTimer::all_reduce(Tensor& x, const Group& g, ReduceOp op) {
  communicate([&] { target().all_reduce(x, g, op); });
}
void StepTimer::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) {
  communicate([&] { target().reduce_scatter(in, out, g, op); });
}
void StepTimer::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  communicate([&] { target().all_gather(in, out, g); });
}
void StepTimer::all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) {
  communicate([&] { target().all_gather_fp8(in, out, g, fp8_elements); });
}
void StepTimer::broadcast(Tensor& x, const Group& g, int root) {
  communicate([&] { target().broadcast(x, g, root); });
}
void StepTimer::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                           std::span<const std::int64_t> recv_counts, const Group& g) {
  communicate([&] { target().all_to_all(in, send_counts, out, recv_counts, g); });
}
void StepTimer::all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                               std::span<const std::int64_t> recv_counts, const Group& g) {
  communicate([&] { target().all_to_all_fp8(in, send_counts, out, recv_counts, g); });
}
void StepTimer::send(const Tensor& x, int peer, int tag) {
  communicate([&] { target().send(x, peer, tag); });
}
void StepTimer::recv(Tensor& x, int peer, int tag) {
  communicate([&] { target().recv(x, peer, tag); });
}
void StepTimer::barrier(const Group& g) {
  communicate([&] { target().barrier(g); });
}

Result<std::vector<RankTiming>> gather_timings(Backend& b, const RankTiming& mine, const Group& world) {
  const int n = world.size();
  Tensor in = b.empty(Shape{3}), out = b.empty(Shape{3 * static_cast<std::int64_t>(n)});
  const float values[3] = {static_cast<float>(mine.compute_s), static_cast<float>(mine.comm_s),
                           static_cast<float>(mine.step_s)};
  b.write(in, values);
  b.all_gather(in, out, world);
  std::vector<float> host(static_cast<std::size_t>(3 * n));
  MT_TRY(b.read(out, host).context("gathering the ranks' step timings"));
  std::vector<RankTiming> all(static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = {host[3 * r], host[3 * r + 1], host[3 * r + 2]};
  return all;
}

StragglerReport straggler_report(std::vector<RankTiming> ranks, const std::vector<int>& stage) {
  StragglerReport out;
  if (ranks.empty()) return out;
  // Classes of ranks that run the same ops: stages, if each has two ranks or more.
  std::map<int, std::vector<double>> by_stage;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    by_stage[r < stage.size() ? stage[r] : 0].push_back(ranks[r].compute_s);
  const bool per_stage = std::all_of(by_stage.begin(), by_stage.end(), [](const auto& kv) { return kv.second.size() >= 2; });
  auto lower_median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2), v.end());
    return v[(v.size() - 1) / 2];
  };
  std::vector<double> all;
  for (const RankTiming& t : ranks) all.push_back(t.compute_s);
  const double global = lower_median(all);
  std::map<int, double> median;
  for (const auto& [s, v] : by_stage) median[s] = per_stage ? lower_median(v) : global;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const double m = median[r < stage.size() ? stage[r] : 0];
    const double lag = ranks[r].compute_s - m;
    if (out.slowest_rank < 0 || lag > out.lag_s) {
      out.slowest_rank = static_cast<int>(r);
      out.slowest_compute_s = ranks[r].compute_s;
      out.median_compute_s = m;
      out.lag_s = lag;
    }
  }
  out.ranks = std::move(ranks);
  return out;
}

}  // namespace meshtrain
