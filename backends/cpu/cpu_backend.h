// The cpu reference backend: real fp32 math on host buffers, the numerical
// ground truth that the cuda backend and every parallel plan are checked
// against.
//
// Beyond the contract of backends/backend.h:
//  * Ops run eagerly on the issuing thread, parallel inside an op on this
//    rank's own threads (a oneTBB task arena of CpuBackendOptions::threads)
//    over chunks whose bounds depend on the shapes only; a GEMM is cut into
//    fixed tiles, each one call of single-threaded OpenBLAS (whose results
//    depend on its thread count and on the matrix sizes it is given, so it
//    is never given a thread count or a partition that depends on ours).
//    Results are bitwise identical run after run and for any thread count.
//  * Storage is a 64-byte aligned host buffer per tensor; memory_stats counts
//    exactly the bytes of live storage (numel · dtype size). zeros() takes
//    memory the C library already holds zeroed (calloc: fresh pages for large
//    buffers), so nothing is written until first use.
//  * bf16/f16 tensors hold 16-bit values (round to nearest even) for empty,
//    fill, copy, cast, write and read; compute ops take fp32 and abort
//    otherwise. i32 holds ids and targets.
//  * Streams and events are bookkeeping only (eager execution satisfies every
//    ordering), but the sticky-error rule holds: the first failed collective
//    records its Error, every later op is a no-op, and read()/synchronize()
//    return it.
//  * Collectives on a group of size 1 are the identity and need no
//    communicator; others go to the Communicator given at construction, i32
//    tensors bitwise through its float spans (all-gather, broadcast,
//    all-to-all, send, recv).
#pragma once

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/communicator.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/parallel.h"

namespace meshtrain {

struct CpuBackendOptions {
  // Threads that run this rank's ops (cpu/threads.h shares the cores out
  // among a process's rank threads); 0: every core this process may use.
  // More than the cores is allowed (TBB's limit is raised for it).
  int threads = 0;
};

class CpuBackend final : public Backend {
 public:
  // The only rank of a world of one: every group is {0}.
  explicit CpuBackend(CpuBackendOptions options = {});
  // Rank comm.rank() of comm.world_size(). `comm` must outlive the backend;
  // only this backend's issuing thread calls it.
  explicit CpuBackend(Communicator& comm, CpuBackendOptions options = {});
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string_view name() const override { return "cpu"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int threads() const { return threads_; }

  #include "backends/runtime_overrides.inc"
  Tensor zeros(const Shape& shape, DType dtype = DType::f32) override;
  bool on_host(const Tensor& t) const;
  void init_normal(Tensor& x, const NormalInitOp& op) override;
  Stream current_stream() const override { return current_; }

  #include "backends/kernel_overrides.inc"
  #include "backends/collective_overrides.inc"

  struct Accounting;  // shared with every storage this backend allocated

 private:
  Tensor allocate(const Shape& shape, DType dtype, bool zeroed, std::string_view op, bool host);
  // Host bytes of t's first element; aborts on a foreign or undefined tensor.
  std::byte* bytes_of(const Tensor& t, std::string_view op) const;
  float* f32(const Tensor& t, std::string_view op) const;
  std::int32_t* i32(const Tensor& t, std::string_view op) const;
  // The bias, mask, sliding window and sinks of `op` as the attention kernel reads them (the bias
  // transposed into `bias_scratch`).
  cpu::ScoreTerms<float> score_terms(const AttentionOp& op, const cpu::AttentionDims& d, std::string_view name,
                                     std::vector<float>& bias_scratch) const;
  // bf16/f16 all_reduce (all: out is in) or reduce_scatter: blocks moved
  // bitwise by all-to-all, summed in fp32 in ascending group order, rounded
  // to 16 bits once; all_reduce then sends each member's block to the others.
  Status half_reduce(const Tensor& in, Tensor& out, const Group& g, ReduceOp op, bool all);
  // Aborts unless this rank is a member of g.
  void check_member(const Group& g, std::string_view op) const;
  // x's elements for send or recv (`op`) with peer_global_rank, after their checks (aborts on misuse).
  std::span<float> point_to_point_buffer(const Tensor& x, int peer_global_rank, std::string_view op) const;
  // The communicator for a group of more than one rank; aborts without one.
  Communicator& comm(std::string_view op) const;
  // Makes a failed collective's status the sticky error.
  void note(Status status, std::string_view op, const Group& g);
  void note(Status status, std::string_view where);
  // Parallel loops of the op being issued run on this rank's threads while it lives.
  cpu::ThreadScope on_threads() const { return cpu::ThreadScope(arena_.get()); }
  void start_threads(CpuBackendOptions options);

  // Protected by nothing: one issuing thread (see backends/backend.h).
  Communicator* comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  std::shared_ptr<Accounting> accounting_;
  int streams_ = 1;
  Stream current_{};
  std::int64_t events_ = 0;
  std::optional<Error> error_;  // the sticky error of the first failed op
  int threads_ = 1;
  std::unique_ptr<tbb::task_arena> arena_;        // this rank's threads
  std::unique_ptr<tbb::task_scheduler_observer> denormals_;  // flushes subnormals on the arena's threads
  std::unique_ptr<tbb::global_control> allow_;    // TBB's thread limit, raised past the cores
};

}  // namespace meshtrain
