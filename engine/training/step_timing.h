// Per-rank step timing and the straggler report of a real run, as
// Megatron-LM's straggler detector gives it: how long each rank computed and
// communicated in a step, and which rank lags the others.
//
// StepTimer wraps a rank's backend (BackendWrapper) and times every
// communication op (collectives, send, recv, barrier). Its time includes
// waiting for the peers: the ranks that wait for a straggler show long
// communication, the straggler long compute. Per step:
//   step_s     host wall time from begin_step to end_step
//   comm_s     time inside communication ops
//   compute_s  the rest of the step on the compute stream
// On a backend that runs ops as they are issued (cpu) the host clock times
// everything. On an asynchronous one (cuda) timing events on the device
// bracket each communication op (Backend::timed_event), and compute_s is
// the step's time minus the communication issued on the compute stream
// (communication on other streams overlaps compute); the step ends with a
// blocking read of the loss, so its host time spans its device work.
//
// Step timing adds no wait of its own: end_step reads back (seconds_between)
// only the communication issued before the step's last blocking call (read,
// synchronize), whose events have happened by then (the engine's streams
// join before that read: the compute stream waits for the reductions). What
// was issued after it (ZeRO's all-gathers of the updated parameters, an
// overlapped update's tail) is still running on the device at end_step; it
// is read at a later end_step, after the next blocking call, and counts in
// that step's comm_s.
//
// Every rank then contributes its timing to an all-gather over the world
// (gather_timings), and straggler_report names the rank whose compute lags
// most behind its peers: the median of its pipeline stage (ranks of a stage
// run the same ops) when every stage has two ranks or more, else the median
// of all ranks; lower medians, so that of two ranks the slower one lags the
// faster.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "backends/backend_wrapper.h"
#include "core/status.h"

namespace meshtrain {

struct RankTiming {
  double compute_s = 0, comm_s = 0, step_s = 0;
};

class StepTimer final : public BackendWrapper {
 public:
  explicit StepTimer(Backend& target) : BackendWrapper(target) {}

  void begin_step();
  Result<RankTiming> end_step();
  // Called before every communication op with the seconds this rank has
  // computed since the previous one (or the step's start): fault injection
  // slows, stops or ends the rank there (engine/training/fault_injection.h).
  void on_communication(std::function<void(double compute_s)> hook) { hook_ = std::move(hook); }

  #include "backends/collective_overrides.inc"
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override;
  void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                      std::span<const std::int64_t> recv_counts, const Group& g) override;
  // Blocking calls: the communication issued before them is complete after.
  Status read(const Tensor& src, std::span<float> host) override;
  Status synchronize() override;

 private:
  using Clock = std::chrono::steady_clock;
  template <class Op>
  void communicate(Op&& op);

  std::function<void(double)> hook_;
  bool in_step_ = false;
  bool device_ = false;  // timing events on the device (asynchronous backend)
  Clock::time_point step_start_, mark_;
  double host_comm_s_ = 0;
  Stream compute_stream_{};
  Event device_start_;
  struct DeviceComm {
    Event start, end;
    bool on_compute_stream;
  };
  // Communication not yet read back from the device. Past 4096 (the
  // backend keeps the last 16384 timing events) the oldest half is read,
  // long finished by then, into the sums below.
  std::vector<DeviceComm> device_comms_;
  // How many of device_comms_ (the first ones) were issued before the last
  // blocking call: those can be read without waiting.
  std::size_t settled_ = 0;
  double device_comm_s_ = 0, device_on_compute_s_ = 0;
  std::optional<Error> device_error_;
  void read_device_comms(std::size_t count);
};

// Every rank's timing of one step, in rank order, on every rank: an
// all-gather over `world` (every rank of the job) on `b`.
Result<std::vector<RankTiming>> gather_timings(Backend& b, const RankTiming& mine, const Group& world);

struct StragglerReport {
  int slowest_rank = -1;
  double slowest_compute_s = 0, median_compute_s = 0;
  double lag_s = 0;  // slowest_compute_s - median_compute_s
  std::vector<RankTiming> ranks;
};
// `stage` by rank: its pipeline stage (ranks of a stage compare among themselves).
StragglerReport straggler_report(std::vector<RankTiming> ranks, const std::vector<int>& stage);

}  // namespace meshtrain
