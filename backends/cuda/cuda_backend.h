// The cuda backend: one rank on one GPU. cuBLASLt for GEMMs, the kernels of
// kernels/ for everything else, NCCL for collectives.
//
// Beyond the contract of backends/backend.h:
//  * Device memory comes from a CachingAllocator (caching_allocator.h): after
//    warm-up the step loop calls no cudaMalloc. memory_stats counts live
//    blocks (sizes rounded to 512 bytes); allocator_stats adds reserved bytes,
//    raw allocations and fragmentation. A tensor's storage remembers every
//    stream that used it, so freeing it is safe without record_stream calls.
//  * Streams are cudaStreams (non-blocking), one per Stream id; events are
//    cudaEvents in a ring of kEventRing: an event may be waited on until
//    kEventRing later events have been recorded.
//  * Dtypes, for mixed precision as models/gpt.cc issues it: empty, fill,
//    copy, cast, write and read take every dtype. GEMMs take f32, bf16 or f16
//    inputs a and b with fp32 accumulation (no TF32) and c (and its bias) f32
//    or the inputs' dtype: a 16-bit product accumulating into an fp32 weight
//    gradient is one GEMM. Every other compute op takes its activation-like
//    tensors (x, out, dout, dx, a and b of add, qkv, logits and dlogits, a
//    norm's weight and bias, an embedding table, gather_rows' src and out) in
//    one storage dtype, f32, bf16 or f16, computes in fp32 (reductions in
//    double) and rounds once on store. Statistics (mean, rstd, lse, row max,
//    sumexp, target logits, losses, accuracy counts, sum and sum_squares
//    outputs), parameter gradients (norm dweight and dbias, bias_backward's
//    db, embedding_backward's dtable, attention's dbias), attention masks and
//    all of clip_coefficient and adamw are fp32; an attention bias is f32 or
//    qkv's dtype. Anything else aborts as misuse, naming the tensors that
//    disagree (op_checks.h: storage_dtype, score_terms_check).
//  * Reductions (sum, norms' parameter gradients, bias, embedding and
//    attention-bias gradients) use fixed partitions and no float atomics: the
//    same inputs give the same bits run after run on one GPU model.
//  * Collectives: NCCL, on the current stream, one communicator per Group id,
//    created on first use by every member (the unique id travels over MPI
//    from the group's first rank). Point-to-point uses one communicator of all
//    ranks created at construction (so construction is collective under MPI);
//    NCCL matches sends and receives between a pair in issue order, so the
//    tag is only checked to be the same on both sides by the schedule.
//    NCCL does not promise the cpu backend's ascending-rank reduction order:
//    results are deterministic run to run for one configuration, but can
//    differ in the last bits from the cpu backend's.
//  * Errors: a failed launch, a device fault found by a blocking call, or a
//    communicator failure or timeout seen by the watchdog thread becomes the
//    sticky error. On a communicator failure every communicator is aborted
//    (ncclCommAbort) so that no rank stays blocked in NCCL.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backends/backend.h"
#include "backends/cuda/caching_allocator.h"

namespace meshtrain::cuda {

namespace kernels {
struct AttentionTerms;  // kernels/kernels.h
}  // namespace kernels

struct CudaOptions {
  int device = -1;       // -1: chosen from the launcher's local rank (device_select.h)
  bool use_mpi = false;  // rank and world from MPI_COMM_WORLD (MPI already initialised)
  std::chrono::milliseconds comm_timeout{std::chrono::minutes(5)};
  // Attention's tuned tensor-core kernels (kernels/kernels.h,
  // AttentionTerms::tuned_tc): the same bits as the reference ones by
  // construction, off until a GPU run has checked that
  // (tests/cuda/test_cuda_attention_tuned.cc); MESHTRAIN_CUDA_ATTENTION=tuned
  // turns them on for `meshtrain` (cuda_factory.cc).
  bool tuned_attention = false;
};

// Visible CUDA devices; 0 when there is no device or no driver.
int device_count();

class DeviceState;
class NcclComms;
class GemmRunner;

class CudaBackend final : public Backend {
 public:
  static constexpr int kMaxStreams = 64;
  static constexpr std::int64_t kEventRing = 1 << 16;

  // Fails without a usable device, or when NCCL/MPI set-up fails.
  static Result<std::unique_ptr<CudaBackend>> create(const CudaOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int device() const;
  AllocatorStats allocator_stats() const;

  // host_zeros is page-locked (cudaHostAlloc), so copies to and from it are
  // asynchronous DMA on the stream that issues them; freeing it waits for the device.
  #include "backends/runtime_overrides.inc"
  bool on_host(const Tensor& t) const;
  Stream current_stream() const override { return current_; }
  // Timing events: a ring of kTimingRing cudaEvents with timing enabled,
  // apart from record()'s (which are created without timing, as is cheaper).
  Event timed_event(Stream s) override;
  Result<double> seconds_between(Event start, Event end) override;
  static constexpr std::int64_t kTimingRing = 1 << 14;

  #include "backends/kernel_overrides.inc"
  // foreach_sum_squares: exactly sum_squares on each tensor in turn (the same
  // kernels, a per-tensor tree and fp32 rounding of out after each tensor).
  // foreach_adamw on host tensors: the clip coefficient is copied to
  // page-locked memory and the update runs on the host's cores in stream
  // order (host_adamw.h); on device tensors: one launch per
  // kernels::kMaxForeach tensors, the bits of adamw on each.

  // Drawn on the device (kernels::init_normal), in x's dtype: the cpu
  // backend's fp32 values bit for bit as tested on an H200 (CUDA's double log
  // and cos are within an ulp of the C library's, which could move an fp32
  // rounding once in ~2^29 draws: tests/cuda/test_cuda_foreach.cc).
  void init_normal(Tensor& x, const NormalInitOp& op) override;

  #include "backends/collective_overrides.inc"
  void send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) override;

  // Bytes this rank has put on the wire so far, counted when a collective or
  // send is issued to NCCL (element size times elements), by the cpu
  // communicators' rule (Communicator::bytes_sent, backends/cpu/
  // communicator.h): all_reduce sends n − own + (G−1)·own, own being its block
  // n·j/G of the n elements (2·(G−1)/G·n in all, as a ring's reduce-scatter
  // and all-gather phases send); reduce_scatter (G−1)·out; all_gather
  // (G−1)·in; broadcast (G−1)·n from the root; all_to_all every block but its
  // own; send n; barrier and groups of one nothing. That is the volume of
  // NCCL's ring algorithms per rank, not what its tree or a broadcast's
  // chain put on each link. Tests read it to check what a plan moves (gradient
  // compression) on a device as on the cpu. Issuing thread only.
  std::int64_t bytes_sent() const { return bytes_sent_; }

  // For calibrate (cuda_fp8_gemm_call, cuda_factory.h): one cuBLASLt FP8 GEMM c (m, n) bf16 = a (m, k) ·
  // b (n, k)ᵀ of E4M3 ones at unit scales (so every element of c is k), with the fast or the split
  // accumulator (gemm.h), on the stream current now, over operands allocated here and held by the call
  // (which must not outlive this backend); c this backend's (m, n) bf16 tensor, or (null) one of the
  // call's own. Run once here: errors are a device without FP8 tensor cores (before compute capability
  // 8.9), an empty shape, a c of another shape, a shape cuBLASLt has no FP8 kernel for.
  Result<std::function<void()>> fp8_gemm_call(std::int64_t m, std::int64_t n, std::int64_t k, bool split_accumulator,
                                              Tensor* c = nullptr);

 private:
  CudaBackend(std::shared_ptr<DeviceState> state, int rank, int world);

  // The device address of t's first element, after checking that t is a
  // defined tensor of this backend; marks t's storage as used by the current
  // stream. Aborts on misuse.
  void* ptr(const Tensor& t, std::string_view op);
  float* f32(const Tensor& t, std::string_view op);
  const std::int32_t* i32(const Tensor& t, std::string_view op);
  // Scratch device memory for one op, released (stream-ordered) by the caller.
  CachingAllocator::Allocation scratch(std::size_t bytes, std::string_view op);
  void release(const CachingAllocator::Allocation& a);
  // foreach_adamw on device tensors (kernels::foreach_adamw).
  void foreach_adamw_device(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp& op);
  // out (1) = scale · Σ x (Σ x² when squares) of xs[0], += of each next one
  // (+= for the first too when accumulate): sum, sum_squares, foreach_sum_squares.
  void reduce(std::span<const Tensor> xs, Tensor& out, bool squares, float scale, bool accumulate,
              std::string_view op);
  void* stream_handle() const;  // the current cudaStream_t
  // Both writes: host values of type T into dst, copied as they are when dst's dtype is `as_is`,
  // else converted (int32 ids through float, as the cpu backend converts them).
  template <class T>
  void write_host(Tensor& dst, std::span<const T> host, DType as_is);
  // op's causal flag, bias and mask (W windows) as the attention kernels take
  // them; a bias is first converted, heads first in f32, into scratch that
  // `bias_scratch` receives (to release after the kernel; untouched without one).
  kernels::AttentionTerms attention_terms(const AttentionOp& op, std::int64_t T, std::int64_t H,
                                          std::int64_t windows, std::string_view name,
                                          CachingAllocator::Allocation& bias_scratch);

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Records the sticky error (the first one wins). Thread-safe.
  void fail(Error e);
  // A launch status of `op`: a failure becomes the sticky error.
  void check(int cuda_status, std::string_view op);
  Status sticky() const;
  void check_member(const Group& g, std::string_view op) const;
  // What reduce_scatter and all_gather share: the member check, `problem` (their blocks check)
  // as misuse, and a plain copy on a group of one; false when nothing is left to launch.
  bool blocks_to_launch(const Tensor& in, Tensor& out, const Group& g, std::string_view op,
                        const std::string& problem);
  int nccl_dtype(const Tensor& t, std::string_view op) const;
  void track(std::string op, const Group& g);
  // send (sending) or recv of x with `peer` on the world communicator, as one ncclSend or ncclRecv.
  void point_to_point(const Tensor& x, int peer, int tag, bool sending);

  std::shared_ptr<DeviceState> state_;  // device, allocator, streams, events
  std::unique_ptr<GemmRunner> gemm_;
  std::unique_ptr<NcclComms> comms_;
  bool tuned_attention_ = false;  // CudaOptions::tuned_attention
  int rank_ = 0;
  int world_size_ = 1;
  Stream current_{};
  std::int64_t events_ = 0;
  std::int64_t timed_events_ = 0;
  std::atomic<bool> failed_{false};
  mutable std::mutex error_mu_;  // guards error_ (the watchdog thread sets it too)
  std::optional<Error> error_;
  Tensor coef_host_;  // (1) page-locked: the clip coefficient an offloaded update reads
  std::int64_t bytes_sent_ = 0;  // bytes_sent()
};

}  // namespace meshtrain::cuda
