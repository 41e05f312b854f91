// CudaBackend: construction, storage, host transfer, streams and events,
// sticky errors and the small elementwise ops. Compute ops are in
// cuda_ops.cc, GEMMs in gemm.cc, collectives in cuda_comm.cc.
#include "backends/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/comm/id_channel.h"
#include "backends/comm/launch.h"
#include "backends/cuda/device_select.h"
#include "backends/cuda/device_state.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/misuse.h"
#include "backends/cuda/nccl_comm.h"
#include "backends/cuda/op_checks.h"
#include "backends/half.h"

namespace meshtrain::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear "no driver" so later calls report their own errors
    return 0;
  }
  return n;
}

void* CudaRawMemory::allocate(std::size_t bytes) {
  cudaSetDevice(device_);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory is not sticky in CUDA; the allocator retries
    return nullptr;
  }
  return p;
}

void CudaRawMemory::release(void* p) {
  cudaSetDevice(device_);
  cudaFree(p);
}

DeviceState::~DeviceState() {
  cudaSetDevice(device);
  for (auto* ring : {&events, &timing})
    for (cudaEvent_t e : *ring)
      if (e != nullptr) cudaEventDestroy(e);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

CudaStorage::~CudaStorage() {
  if (host_) {
    // Copies and host updates issued on it may still be pending: wait for the
    // device (host buffers are long-lived: the optimizer state, staging buffers).
    cudaSetDevice(state_->device);
    cudaDeviceSynchronize();
    cudaFreeHost(alloc_.ptr);
    (void)cudaGetLastError();
    state_->host_live -= static_cast<std::int64_t>(bytes_);
    return;
  }
  const std::uint64_t others = used_ & ~(1ull << stream_);
  if (others == 0) {  // only its own stream used it: stream order makes reuse safe
    state_->allocator.free(alloc_);
    return;
  }
  // Reusable once the work already issued on the other streams is done.
  cudaSetDevice(state_->device);
  std::vector<cudaEvent_t> done;
  for (int s = 0; s < CudaBackend::kMaxStreams; ++s) {
    if (!(others >> s & 1)) continue;
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(e, state_->streams[static_cast<std::size_t>(s)]) != cudaSuccess) {
      // Without an event there is no safe moment: keep the block out of reuse.
      (void)cudaGetLastError();
      if (e != nullptr) cudaEventDestroy(e);
      for (cudaEvent_t d : done) cudaEventDestroy(d);
      return;
    }
    done.push_back(e);
  }
  const int device = state_->device;
  state_->allocator.free_when(alloc_, [done = std::move(done), device]() mutable {
    cudaSetDevice(device);
    for (cudaEvent_t e : done)
      if (cudaEventQuery(e) == cudaErrorNotReady) return false;
    (void)cudaGetLastError();
    for (cudaEvent_t e : done) cudaEventDestroy(e);
    return true;
  });
}

// ---- construction ---------------------------------------------------------------

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const CudaOptions& options) {
  const int count = device_count();
  if (count == 0) return make_error("cuda backend: no CUDA device (cudaGetDeviceCount found none)");
  int device = options.device;
  if (device < 0) {
    MT_ASSIGN(const std::optional<int> local, local_rank_from_env());
    MT_ASSIGN(device, select_device(local, count));
  } else if (device >= count) {
    return make_error("cuda backend: device {} requested, {} visible", device, count);
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return make_error("cuda backend: cudaSetDevice({}): {}", device, cudaGetErrorString(e));
  auto state = std::make_shared<DeviceState>(device);
  cudaStream_t s0 = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking); e != cudaSuccess)
    return make_error("cuda backend: creating the compute stream: {}", cudaGetErrorString(e));
  state->streams.push_back(s0);
  int rank = 0, world = 1;
  std::unique_ptr<IdChannel> channel;
  if (options.use_mpi) {
    MT_ASSIGN(auto mpi, MpiIdChannel::create());
    rank = mpi->rank();
    world = mpi->world_size();
    channel = std::move(mpi);
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(state, rank, world));
  b->tuned_attention_ = options.tuned_attention;
  MT_ASSIGN(b->gemm_, GemmRunner::create(state->allocator));
  b->comms_ = std::make_unique<NcclComms>(rank, world, device, std::move(channel),
                                          options.comm_timeout,
                                          [raw = b.get()](Error e) { raw->fail(std::move(e)); });
  if (world > 1) {
    Status s = b->comms_->init_world();
    if (!s.ok()) return std::move(s).error().context(fmt::format("cuda backend rank {}", rank));
  }
  return b;
}

CudaBackend::CudaBackend(std::shared_ptr<DeviceState> state, int rank, int world)
    : state_(std::move(state)), rank_(rank), world_size_(world) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(state_->device);
  for (cudaStream_t s : state_->streams) cudaStreamSynchronize(s);
  comms_.reset();  // stops the watchdog before the error sink goes away
  gemm_.reset();
}

int CudaBackend::device() const { return state_->device; }

// ---- errors ------------------------------------------------------------------------

void CudaBackend::fail(Error e) {
  std::lock_guard lock(error_mu_);
  if (error_) return;
  error_ = std::move(e);
  failed_.store(true, std::memory_order_release);
}

void CudaBackend::check(int cuda_status, std::string_view op) {
  if (cuda_status == cudaSuccess) return;
  const auto e = static_cast<cudaError_t>(cuda_status);
  fail(make_error("cuda rank {} (device {}): {}: {} ({})", rank_, state_->device, op,
                  cudaGetErrorString(e), cudaGetErrorName(e)));
}

Status CudaBackend::sticky() const {
  std::lock_guard lock(error_mu_);
  if (error_) return *error_;
  return ok_status();
}

// ---- memory ------------------------------------------------------------------------

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  for (auto d : shape.dims())
    if (d < 0) misuse("empty: negative dimension in {}", shape.str());
  const auto bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  auto a = state_->allocator.allocate(bytes, current_.id);
  if (!a.ok()) misuse("empty {} {}: {}", shape.str(), dtype_name(dtype), a.error().message());
  return Tensor(std::make_shared<CudaStorage>(state_, *a, bytes, current_.id), shape, dtype);
}

Tensor CudaBackend::host_zeros(const Shape& shape, DType dtype) {
  for (auto d : shape.dims())
    if (d < 0) misuse("host_zeros: negative dimension in {}", shape.str());
  const auto bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  void* p = nullptr;
  if (bytes > 0) {
    cudaSetDevice(state_->device);
    if (const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); e != cudaSuccess)
      misuse("host_zeros {} {}: cudaHostAlloc of {} bytes failed ({}); offload less or add host memory", shape.str(),
             dtype_name(dtype), bytes, cudaGetErrorString(e));
    std::memset(p, 0, bytes);
  }
  state_->host_live += static_cast<std::int64_t>(bytes);
  state_->host_peak = std::max(state_->host_peak, state_->host_live.load());
  return Tensor(std::make_shared<CudaStorage>(state_, p, bytes, CudaStorage::Pinned{}), shape, dtype);
}

bool CudaBackend::on_host(const Tensor& t) const {
  auto* s = dynamic_cast<CudaStorage*>(t.storage());
  return s != nullptr && s->host();
}

MemoryStats CudaBackend::memory_stats() const {
  const AllocatorStats s = state_->allocator.stats();
  return MemoryStats{s.live_bytes, s.peak_bytes, state_->host_live.load(), state_->host_peak};
}

AllocatorStats CudaBackend::allocator_stats() const { return state_->allocator.stats(); }

void CudaBackend::reset_peak() {
  state_->allocator.reset_peak();
  state_->host_peak = state_->host_live.load();
}

void* CudaBackend::ptr(const Tensor& t, std::string_view op) {
  if (!t.defined()) misuse("{}: undefined tensor", op);
  auto* s = dynamic_cast<CudaStorage*>(t.storage());
  if (s == nullptr || s->owner() != state_.get())
    misuse("{}: tensor {} belongs to another backend", op, t.shape().str());
  if (s->host() && !takes_host_memory(op))
    misuse("{}: tensor {} is in host memory (host_zeros), which only copy, write, read and foreach_adamw take", op,
           t.shape().str());
  const std::size_t size = dtype_size(t.dtype());
  if (static_cast<std::size_t>(t.offset() + t.numel()) * size > s->bytes())
    misuse("{}: tensor view {} at offset {} runs past its storage", op, t.shape().str(), t.offset());
  s->mark_used(current_.id);
  return s->data() + static_cast<std::size_t>(t.offset()) * size;
}

float* CudaBackend::f32(const Tensor& t, std::string_view op) {
  if (t.defined() && t.dtype() != DType::f32)
    misuse("{}: needs fp32, got a {} tensor {}", op, dtype_name(t.dtype()), t.shape().str());
  return static_cast<float*>(ptr(t, op));
}

const std::int32_t* CudaBackend::i32(const Tensor& t, std::string_view op) {
  if (t.defined() && t.dtype() != DType::i32)
    misuse("{}: needs int32, got a {} tensor {}", op, dtype_name(t.dtype()), t.shape().str());
  return static_cast<const std::int32_t*>(ptr(t, op));
}

CachingAllocator::Allocation CudaBackend::scratch(std::size_t bytes, std::string_view op) {
  auto a = state_->allocator.allocate(bytes, current_.id);
  if (!a.ok()) misuse("{}: scratch of {} bytes: {}", op, bytes, a.error().message());
  return *a;
}

// Stream-ordered: later work on this stream may reuse the block at once.
void CudaBackend::release(const CachingAllocator::Allocation& a) { state_->allocator.free(a); }

void* CudaBackend::stream_handle() const {
  return state_->streams[static_cast<std::size_t>(current_.id)];
}

// ---- host transfer -----------------------------------------------------------------

namespace {
// Host values (float, or int32 ids taken as floats) converted to `dtype`'s bytes, as the cpu
// backend stores them.
template <class T>
std::vector<std::byte> to_device_bytes(std::span<const T> host, DType dtype) {
  std::vector<std::byte> out(host.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < host.size(); ++i) {
    const auto x = static_cast<float>(host[i]);
    switch (dtype) {
      case DType::f32: std::memcpy(out.data() + 4 * i, &x, 4); break;
      case DType::bf16: {
        const std::uint16_t h = float_to_bf16(x);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::f16: {
        const std::uint16_t h = float_to_f16(x);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::i32: {
        const auto v = static_cast<std::int32_t>(std::lround(x));
        std::memcpy(out.data() + 4 * i, &v, 4);
        break;
      }
    }
  }
  return out;
}
}  // namespace

template <class T>
void CudaBackend::write_host(Tensor& dst, std::span<const T> host, DType as_is) {
  void* d = ptr(dst, "write");
  if (static_cast<std::int64_t>(host.size()) != dst.numel())
    misuse("write: {} host values into a tensor {}", host.size(), dst.shape().str());
  if (failed() || host.empty()) return;
  // From pageable memory cudaMemcpyAsync returns once the bytes are staged,
  // so the host buffer (and the converted copy) may go away on return.
  const auto s = static_cast<cudaStream_t>(stream_handle());
  if (dst.dtype() == as_is) {
    check(cudaMemcpyAsync(d, host.data(), host.size_bytes(), cudaMemcpyDefault, s), "write");
    return;
  }
  const std::vector<std::byte> bytes = to_device_bytes(host, dst.dtype());
  check(cudaMemcpyAsync(d, bytes.data(), bytes.size(), cudaMemcpyDefault, s), "write");
}

void CudaBackend::write(Tensor& dst, std::span<const float> host) { write_host(dst, host, DType::f32); }

void CudaBackend::write(Tensor& dst, std::span<const std::int32_t> host) { write_host(dst, host, DType::i32); }

Status CudaBackend::read(const Tensor& src, std::span<float> host) {
  const void* d = ptr(src, "read");
  if (static_cast<std::int64_t>(host.size()) != src.numel())
    misuse("read: a tensor {} into {} host values", src.shape().str(), host.size());
  if (failed()) return sticky();
  const auto s = static_cast<cudaStream_t>(stream_handle());
  std::vector<std::byte> bytes(src.bytes());
  check(cudaMemcpyAsync(bytes.data(), d, bytes.size(), cudaMemcpyDefault, s), "read");
  check(cudaStreamSynchronize(s), "read (a device error of an earlier op on this stream)");
  if (failed()) return sticky();
  for (std::size_t i = 0; i < host.size(); ++i) {
    switch (src.dtype()) {
      case DType::f32: std::memcpy(&host[i], bytes.data() + 4 * i, 4); break;
      case DType::bf16:
      case DType::f16: {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        host[i] = src.dtype() == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
        break;
      }
      case DType::i32: {
        std::int32_t v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        host[i] = static_cast<float>(v);
        break;
      }
    }
  }
  return ok_status();
}

// ---- streams and events --------------------------------------------------------------

namespace {
// The handle of stream s, which `op` (in the message) requires to have been created here.
cudaStream_t stream_of(const DeviceState& state, Stream s, std::string_view op) {
  if (s.id < 0 || s.id >= static_cast<int>(state.streams.size()))
    misuse("{}: stream {} was not created here", op, s.id);
  return state.streams[static_cast<std::size_t>(s.id)];
}

// The slot of event number `id` in a lazily grown ring of `ring` events (null until created).
cudaEvent_t& ring_slot(std::vector<cudaEvent_t>& events, std::int64_t id, std::int64_t ring) {
  const auto slot = static_cast<std::size_t>(id % ring);
  if (events.size() <= slot) events.resize(slot + 1, nullptr);
  return events[slot];
}
}  // namespace

Stream CudaBackend::create_stream(std::string_view name) {
  if (static_cast<int>(state_->streams.size()) >= kMaxStreams)
    misuse("create_stream '{}': at most {} streams", name, kMaxStreams);
  cudaStream_t s = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
    misuse("create_stream '{}': {}", name, cudaGetErrorString(e));
  state_->streams.push_back(s);
  return Stream{static_cast<int>(state_->streams.size()) - 1};
}

void CudaBackend::set_stream(Stream s) {
  stream_of(*state_, s, "set_stream");
  current_ = s;
}

Event CudaBackend::record(Stream s) {
  const cudaStream_t stream = stream_of(*state_, s, "record");
  const std::int64_t id = events_++;
  cudaEvent_t& e = ring_slot(state_->events, id, kEventRing);
  if (e == nullptr) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "record");
  if (e != nullptr) check(cudaEventRecord(e, stream), "record");
  return Event{id};
}

void CudaBackend::wait(Stream s, Event e) {
  const cudaStream_t stream = stream_of(*state_, s, "wait");
  if (!e.valid() || e.id >= events_) misuse("wait: event {} was not recorded here", e.id);
  if (events_ - e.id > kEventRing)
    misuse("wait: event {} is older than the last {} events and was recycled", e.id, kEventRing);
  cudaEvent_t ev = state_->events[static_cast<std::size_t>(e.id % kEventRing)];
  if (ev != nullptr) check(cudaStreamWaitEvent(stream, ev, 0), "wait");
}

Event CudaBackend::timed_event(Stream s) {
  const cudaStream_t stream = stream_of(*state_, s, "timed_event");
  const std::int64_t id = timed_events_++;
  cudaEvent_t& e = ring_slot(state_->timing, id, kTimingRing);
  if (e == nullptr) check(cudaEventCreate(&e), "timed_event");  // timing enabled
  if (e != nullptr) check(cudaEventRecord(e, stream), "timed_event");
  return Event{id};
}

Result<double> CudaBackend::seconds_between(Event start, Event end) {
  for (Event e : {start, end})
    if (!e.valid() || e.id >= timed_events_ || timed_events_ - e.id > kTimingRing)
      return make_error("seconds_between: timing event {} is not one of the last {} recorded here", e.id, kTimingRing);
  cudaEvent_t a = state_->timing[static_cast<std::size_t>(start.id % kTimingRing)];
  cudaEvent_t b = state_->timing[static_cast<std::size_t>(end.id % kTimingRing)];
  if (a == nullptr || b == nullptr) return make_error("seconds_between: a timing event could not be recorded");
  if (cudaError_t e = cudaEventSynchronize(b); e != cudaSuccess)
    return make_error("seconds_between: {}", cudaGetErrorString(e));
  float ms = 0;
  if (cudaError_t e = cudaEventElapsedTime(&ms, a, b); e != cudaSuccess)
    return make_error("seconds_between: {}", cudaGetErrorString(e));
  return static_cast<double>(ms) * 1e-3;
}

Status CudaBackend::synchronize() {
  for (cudaStream_t s : state_->streams)
    check(cudaStreamSynchronize(s), "synchronize (a device error of an earlier op)");
  return sticky();
}

// ---- elementwise and small ops --------------------------------------------------------

namespace {
int code(DType t) { return kernel_dtype(t); }
// The shared storage dtype of an elementwise op's tensors (misuse otherwise).
DType storage_of(std::initializer_list<Named> tensors, std::string_view op) {
  Result<DType> d = storage_dtype(tensors);
  if (!d.ok()) misuse("{}: {}", op, d.error().message());
  return *d;
}
void expect_same_numel(const Tensor& a, const Tensor& b, std::string_view op) {
  if (a.numel() != b.numel())
    misuse("{}: {} and {} differ in element count", op, a.shape().str(), b.shape().str());
}
}  // namespace

#define MT_STREAM static_cast<cudaStream_t>(stream_handle())

void CudaBackend::fill(Tensor& x, float value) {
  void* p = ptr(x, "fill");
  if (failed()) return;
  check(kernels::fill(p, code(x.dtype()), x.numel(), value, MT_STREAM), "fill");
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  const void* s = ptr(src, "copy");
  void* d = ptr(dst, "copy");
  expect_same_numel(src, dst, "copy");
  if (src.dtype() != dst.dtype())
    misuse("copy: {} to {} (use cast)", dtype_name(src.dtype()), dtype_name(dst.dtype()));
  if (failed() || src.numel() == 0) return;
  // cudaMemcpyDefault: either side may be page-locked host memory (host_zeros), an asynchronous DMA over PCIe.
  check(cudaMemcpyAsync(d, s, src.bytes(), cudaMemcpyDefault, MT_STREAM), "copy");
}

void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  const void* s = ptr(src, "cast");
  void* d = ptr(dst, "cast");
  expect_same_numel(src, dst, "cast");
  if (src.dtype() == DType::i32 || dst.dtype() == DType::i32)
    misuse("cast: {} to {}; cast converts between float dtypes", dtype_name(src.dtype()),
           dtype_name(dst.dtype()));
  if (failed()) return;
  check(kernels::cast(s, code(src.dtype()), d, code(dst.dtype()), src.numel(), MT_STREAM), "cast");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const DType dt = storage_of({{"a", &a}, {"b", &b}, {"out", &out}}, "add");
  const void *pa = ptr(a, "add"), *pb = ptr(b, "add");
  void* po = ptr(out, "add");
  expect_same_numel(a, b, "add");
  expect_same_numel(a, out, "add");
  if (failed()) return;
  check(kernels::add(pa, pb, po, code(dt), a.numel(), MT_STREAM), "add");
}

void CudaBackend::scale(Tensor& x, float alpha) {
  const DType dt = storage_of({{"x", &x}}, "scale");
  void* p = ptr(x, "scale");
  if (failed()) return;
  check(kernels::scale(p, code(dt), x.numel(), alpha, MT_STREAM), "scale");
}

void CudaBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  const DType dt = storage_of({{"x", &x}, {"y", &y}}, "axpy");
  const void* px = ptr(x, "axpy");
  void* py = ptr(y, "axpy");
  expect_same_numel(x, y, "axpy");
  if (failed()) return;
  check(kernels::axpy(alpha, px, py, code(dt), x.numel(), MT_STREAM), "axpy");
}

void CudaBackend::sum(const Tensor& x, Tensor& out, float scale, bool accumulate) {
  reduce({&x, 1}, out, false, scale, accumulate, "sum");
}

void CudaBackend::sum_squares(const Tensor& x, Tensor& out, bool accumulate) {
  reduce({&x, 1}, out, true, 1.f, accumulate, "sum_squares");
}

void CudaBackend::fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) {
  const DType dt = storage_of({{"x", &x}, {"y", &y}}, "fp8_cast");
  const void* px = ptr(x, "fp8_cast");
  void* py = ptr(y, "fp8_cast");
  float* pa = f32(amax, "fp8_cast");
  expect_same_numel(x, y, "fp8_cast");
  if (amax.numel() != 1) misuse("fp8_cast: amax {} must have one element", amax.shape().str());
  if (failed()) return;
  check(kernels::fp8_cast(px, py, code(dt), x.numel(), op.scale, op.format == Fp8Format::e5m2, op.current, pa,
                          MT_STREAM),
        "fp8_cast");
}

void CudaBackend::amax(const Tensor& x, Tensor& out) {
  const DType dt = storage_of({{"x", &x}}, "amax");
  const void* px = ptr(x, "amax");
  float* po = f32(out, "amax");
  if (out.numel() != 1) misuse("amax: out {} must have one element", out.shape().str());
  if (failed()) return;
  check(kernels::amax(px, code(dt), x.numel(), po, MT_STREAM), "amax");
}

// One pass for every tensor (two launches per kMaxForeach tensors, one
// scratch): the same kernels as sum_squares on each in turn, so the same bits.
void CudaBackend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  reduce(xs, out, true, 1.f, true, "foreach_sum_squares");
}

void CudaBackend::reduce(std::span<const Tensor> xs, Tensor& out, bool squares, float scale, bool accumulate,
                         std::string_view op) {
  float* po = f32(out, op);
  if (out.numel() != 1) misuse("{}: out {} must have one element", op, out.shape().str());
  std::vector<kernels::ReduceInput> in;
  in.reserve(xs.size());
  for (const Tensor& x : xs) {
    const DType dt = storage_of({{"x", &x}}, op);
    in.push_back({ptr(x, op), code(dt), x.numel()});
  }
  if (failed() || in.empty()) return;
  std::size_t most = 0;  // partials of the largest launch
  for (std::size_t b = 0; b < in.size(); b += kernels::kMaxForeach) {
    std::size_t blocks = 0;
    for (std::size_t k = b; k < std::min(in.size(), b + kernels::kMaxForeach); ++k)
      blocks += static_cast<std::size_t>(kernels::reduce_blocks(in[k].n));
    most = std::max(most, blocks);
  }
  const auto tmp = scratch(sizeof(double) * most, op);
  for (std::size_t b = 0; b < in.size(); b += kernels::kMaxForeach) {
    const int count = static_cast<int>(std::min<std::size_t>(kernels::kMaxForeach, in.size() - b));
    // Launches after the first add onto what the ones before left in out.
    check(kernels::reduce_sum(in.data() + b, count, squares, scale, accumulate || b > 0, po,
                              static_cast<double*>(tmp.ptr), MT_STREAM),
          op);
  }
  release(tmp);
}

}  // namespace meshtrain::cuda
