// CpuBackend: storage, host transfer, streams, small ops and collectives.
// The compute kernels' wrappers are in cpu_ops.cc.
#include "backends/cpu/cpu_backend.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <malloc.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "backends/cpu/kernels/elementwise.h"
#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/parallel.h"
#include "backends/allocation_failure.h"
#include "backends/collective_checks.h"
#include "backends/cpu/comm/common.h"
#include "backends/cpu/misuse.h"
#include "backends/half.h"
#include "backends/cpu/threads.h"

namespace meshtrain {

using cpu::misuse;

struct CpuBackend::Accounting {
  std::atomic<std::int64_t> live{0};  // storage may be released on any thread
  std::int64_t peak = 0;              // written by the issuing thread only
  // The host pool (host_zeros): the same RAM, counted apart so that an
  // offloaded run's device figures are what a GPU would hold.
  std::atomic<std::int64_t> host_live{0};
  std::int64_t host_peak = 0;
};

namespace {

class CpuStorage final : public Storage {
 public:
  // `zeroed`: from calloc (which skips the writes for memory it knows is
  // zero), aligned by hand; else aligned_alloc.
  CpuStorage(std::shared_ptr<CpuBackend::Accounting> accounting, std::size_t bytes, bool zeroed, bool host)
      : accounting_(std::move(accounting)), bytes_(bytes), host_(host) {
    if (bytes_ > 0) {
      constexpr std::size_t align = 64;
      if (zeroed) {
        base_ = std::calloc(bytes_ + align, 1);
        const auto at = (reinterpret_cast<std::uintptr_t>(base_) + align - 1) / align * align;
        data_ = base_ == nullptr ? nullptr : reinterpret_cast<std::byte*>(at);
      } else {
        base_ = std::aligned_alloc(align, (bytes_ + align - 1) / align * align);
        data_ = static_cast<std::byte*>(base_);
      }
    }
    // A failed allocation (data_ null) is the backend's sticky error, not an abort: see empty().
    if (!failed()) pool() += static_cast<std::int64_t>(bytes_);
  }
  ~CpuStorage() override {
    std::free(base_);
    if (!failed()) pool() -= static_cast<std::int64_t>(bytes_);
  }
  bool failed() const { return bytes_ > 0 && data_ == nullptr; }
  CpuStorage(const CpuStorage&) = delete;
  CpuStorage& operator=(const CpuStorage&) = delete;

  const CpuBackend::Accounting* owner() const { return accounting_.get(); }
  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  bool host() const { return host_; }

 private:
  std::atomic<std::int64_t>& pool() const { return host_ ? accounting_->host_live : accounting_->live; }

  std::shared_ptr<CpuBackend::Accounting> accounting_;
  std::size_t bytes_;
  bool host_;
  void* base_ = nullptr;  // what the allocator returned
  std::byte* data_ = nullptr;
};

bool is_float(DType t) { return t != DType::i32; }

float load(DType t, const std::byte* p, std::int64_t i) {
  switch (t) {
    case DType::f32:
      return reinterpret_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::i32:
      return static_cast<float>(reinterpret_cast<const std::int32_t*>(p)[i]);
  }
  return 0.f;
}

void store(DType t, std::byte* p, std::int64_t i, float v) {
  switch (t) {
    case DType::f32:
      reinterpret_cast<float*>(p)[i] = v;
      return;
    case DType::bf16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_bf16(v);
      return;
    case DType::f16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_f16(v);
      return;
    case DType::i32:
      reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(std::lround(v));
      return;
  }
}

// dst[i] = convert(src[i]) for n elements, dtype to dtype through float.
void convert(DType from, const std::byte* src, DType to, std::byte* dst, std::int64_t n) {
  cpu::for_chunks(n, cpu::kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) store(to, dst, i, load(from, src, i));
  });
}

void expect_same_numel(const Tensor& a, const Tensor& b, std::string_view op) {
  if (a.numel() != b.numel())
    misuse("{}: {} and {} differ in element count", op, a.shape().str(), b.shape().str());
}

}  // namespace

CpuBackend::CpuBackend(CpuBackendOptions options) : accounting_(std::make_shared<Accounting>()) {
  start_threads(options);
}

CpuBackend::CpuBackend(Communicator& comm, CpuBackendOptions options)
    : comm_(&comm),
      rank_(comm.rank()),
      world_size_(comm.world_size()),
      accounting_(std::make_shared<Accounting>()) {
  start_threads(options);
}

namespace {

// Subnormal floats cost x86 cores a microcode assist per operation (up to
// 100x slower): a model that learns its data confidently drives softmax
// probabilities and gradients there, and the step slows for nothing
// (measured: tp 2 of the tiny model on repetitive bytes, 49 ms a step
// against 31 ms). Flush them to zero (FTZ) and read them as zero (DAZ), as
// PyTorch's set_flush_denormal does, on the rank's thread and every thread
// that enters its arena; the same on every rank and thread count, so runs
// stay deterministic.
void flush_denormals() {
#if defined(__SSE__)
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
}

class FlushDenormals : public tbb::task_scheduler_observer {
 public:
  explicit FlushDenormals(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) { observe(true); }
  ~FlushDenormals() override { observe(false); }
  void on_scheduler_entry(bool) override { flush_denormals(); }
};

// A training step frees and re-allocates the same activations every step.
// glibc returns large blocks to the kernel (mmap above its threshold, heap
// trimming above 2x it), so each step page-faults its activations back in:
// measured on the tiny model (micro-batch 8, 64 tokens, 4 micro-batches),
// ~8,000 page faults and up to half the step in the kernel, with step times
// swinging between 38 and 75 ms from run to run. Fixed thresholds keep freed
// memory in the process for the next step (and stop glibc's threshold from
// moving with the order of frees); the process holds its peak, which it
// needed anyway. Process-wide, set once; before any rank allocates.
void keep_freed_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // 32 MiB: the largest threshold glibc takes on 64-bit (mallopt refuses
    // more); blocks above it still come from mmap, where the page faults are
    // small beside the compute on so large a tensor.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

}  // namespace

void CpuBackend::start_threads(CpuBackendOptions options) {
  keep_freed_memory();
  cpu::ensure_single_threaded_blas();
  flush_denormals();
  if (options.threads < 0) misuse("CpuBackend: {} threads", options.threads);
  threads_ = options.threads > 0 ? options.threads : cpu::available_cores();
  // TBB lets all arenas together use as many threads as cores, unless told otherwise.
  const auto total = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  if (static_cast<std::size_t>(threads_) > total)
    allow_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                   static_cast<std::size_t>(threads_));
  arena_ = std::make_unique<tbb::task_arena>(threads_);
  denormals_ = std::make_unique<FlushDenormals>(*arena_);
}

CpuBackend::~CpuBackend() = default;

// ---- memory ------------------------------------------------------------------

Tensor CpuBackend::allocate(const Shape& shape, DType dtype, bool zeroed, std::string_view op, bool host) {
  for (auto d : shape.dims())
    if (d < 0) misuse("{}: negative dimension in {}", op, shape.str());
  const auto bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<CpuStorage>(accounting_, bytes, zeroed, host);
  if (storage->failed() && !error_)
    note(make_error("{} (this rank holds {} bytes already); use a smaller model, batch or sequence, or more ranks",
                    allocation_failure_message("host", bytes,
                                               fmt::format("a {} tensor {}", dtype_name(dtype), shape.str())),
                    accounting_->live.load()),
         "empty");
  accounting_->peak = std::max(accounting_->peak, accounting_->live.load());
  accounting_->host_peak = std::max(accounting_->host_peak, accounting_->host_live.load());
  return Tensor(std::move(storage), shape, dtype);
}

Tensor CpuBackend::empty(const Shape& shape, DType dtype) { return allocate(shape, dtype, false, "empty", false); }

Tensor CpuBackend::zeros(const Shape& shape, DType dtype) { return allocate(shape, dtype, true, "zeros", false); }

Tensor CpuBackend::host_zeros(const Shape& shape, DType dtype) {
  return allocate(shape, dtype, true, "host_zeros", true);
}

MemoryStats CpuBackend::memory_stats() const {
  return MemoryStats{accounting_->live.load(), accounting_->peak, accounting_->host_live.load(),
                     accounting_->host_peak};
}

void CpuBackend::reset_peak() {
  accounting_->peak = accounting_->live.load();
  accounting_->host_peak = accounting_->host_live.load();
}

bool CpuBackend::on_host(const Tensor& t) const {
  auto* s = dynamic_cast<CpuStorage*>(t.storage());
  return s != nullptr && s->host();
}

std::byte* CpuBackend::bytes_of(const Tensor& t, std::string_view op) const {
  if (!t.defined()) misuse("{}: undefined tensor", op);
  auto* s = dynamic_cast<CpuStorage*>(t.storage());
  if (s == nullptr || s->owner() != accounting_.get())
    misuse("{}: tensor {} belongs to another backend", op, t.shape().str());
  if (s->host() && !takes_host_memory(op))
    misuse("{}: tensor {} is in host memory (host_zeros), which only copy, write, read and foreach_adamw take",
           op, t.shape().str());
  const std::size_t size = dtype_size(t.dtype());
  if (static_cast<std::size_t>(t.offset() + t.numel()) * size > s->bytes())
    misuse("{}: tensor view {} at offset {} runs past its storage", op, t.shape().str(),
           t.offset());
  // Storage that failed to allocate has no bytes: the sticky error is set, and
  // every op returns before it touches the pointer.
  if (s->failed()) return nullptr;
  return s->data() + static_cast<std::size_t>(t.offset()) * size;
}

float* CpuBackend::f32(const Tensor& t, std::string_view op) const {
  if (t.defined() && t.dtype() != DType::f32)
    misuse("{}: needs fp32, got a {} tensor {}", op, dtype_name(t.dtype()), t.shape().str());
  return reinterpret_cast<float*>(bytes_of(t, op));
}

std::int32_t* CpuBackend::i32(const Tensor& t, std::string_view op) const {
  if (t.defined() && t.dtype() != DType::i32)
    misuse("{}: needs int32, got a {} tensor {}", op, dtype_name(t.dtype()), t.shape().str());
  return reinterpret_cast<std::int32_t*>(bytes_of(t, op));
}

// ---- host transfer -------------------------------------------------------------

void CpuBackend::write(Tensor& dst, std::span<const float> host) {
  std::byte* d = bytes_of(dst, "write");
  if (static_cast<std::int64_t>(host.size()) != dst.numel())
    misuse("write: {} host values into a tensor {}", host.size(), dst.shape().str());
  if (error_) return;
  const auto threads = on_threads();
  convert(DType::f32, reinterpret_cast<const std::byte*>(host.data()), dst.dtype(), d, dst.numel());
}

void CpuBackend::write(Tensor& dst, std::span<const std::int32_t> host) {
  std::byte* d = bytes_of(dst, "write");
  if (static_cast<std::int64_t>(host.size()) != dst.numel())
    misuse("write: {} host values into a tensor {}", host.size(), dst.shape().str());
  if (error_) return;
  const auto threads = on_threads();
  if (dst.dtype() == DType::i32) {
    std::memcpy(d, host.data(), host.size_bytes());
    return;
  }
  convert(DType::i32, reinterpret_cast<const std::byte*>(host.data()), dst.dtype(), d, dst.numel());
}

Status CpuBackend::read(const Tensor& src, std::span<float> host) {
  const std::byte* s = bytes_of(src, "read");
  if (static_cast<std::int64_t>(host.size()) != src.numel())
    misuse("read: a tensor {} into {} host values", src.shape().str(), host.size());
  if (error_) return *error_;
  const auto threads = on_threads();
  convert(src.dtype(), s, DType::f32, reinterpret_cast<std::byte*>(host.data()), src.numel());
  return ok_status();
}

// ---- streams and events ----------------------------------------------------------

Stream CpuBackend::create_stream(std::string_view) { return Stream{streams_++}; }

void CpuBackend::set_stream(Stream s) {
  if (s.id < 0 || s.id >= streams_) misuse("set_stream: stream {} was not created here", s.id);
  current_ = s;
}

Event CpuBackend::record(Stream s) {
  if (s.id < 0 || s.id >= streams_) misuse("record: stream {} was not created here", s.id);
  return Event{events_++};
}

void CpuBackend::wait(Stream s, Event e) {
  if (s.id < 0 || s.id >= streams_) misuse("wait: stream {} was not created here", s.id);
  if (!e.valid() || e.id >= events_) misuse("wait: event {} was not recorded here", e.id);
}

Status CpuBackend::synchronize() {
  if (error_) return *error_;
  return ok_status();
}

// ---- elementwise and small ops --------------------------------------------------------

void CpuBackend::fill(Tensor& x, float value) {
  std::byte* p = bytes_of(x, "fill");
  if (error_) return;
  const auto threads = on_threads();
  switch (x.dtype()) {
    case DType::f32:
      cpu::fill(x.numel(), reinterpret_cast<float*>(p), value);
      return;
    case DType::bf16:
      cpu::fill(x.numel(), reinterpret_cast<std::uint16_t*>(p), float_to_bf16(value));
      return;
    case DType::f16:
      cpu::fill(x.numel(), reinterpret_cast<std::uint16_t*>(p), float_to_f16(value));
      return;
    case DType::i32:
      cpu::fill(x.numel(), reinterpret_cast<std::int32_t*>(p),
                static_cast<std::int32_t>(std::lround(value)));
      return;
  }
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  const std::byte* s = bytes_of(src, "copy");
  std::byte* d = bytes_of(dst, "copy");
  expect_same_numel(src, dst, "copy");
  if (src.dtype() != dst.dtype())
    misuse("copy: {} to {} (use cast)", dtype_name(src.dtype()), dtype_name(dst.dtype()));
  if (error_) return;
  const auto threads = on_threads();
  const auto size = static_cast<std::int64_t>(dtype_size(src.dtype()));
  cpu::for_chunks(src.numel() * size, cpu::kGrain * 4, [&](std::int64_t b, std::int64_t e) {
    std::memmove(d + b, s + b, static_cast<std::size_t>(e - b));
  });
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  const std::byte* s = bytes_of(src, "cast");
  std::byte* d = bytes_of(dst, "cast");
  expect_same_numel(src, dst, "cast");
  if (!is_float(src.dtype()) || !is_float(dst.dtype()))
    misuse("cast: {} to {}; cast converts between float dtypes", dtype_name(src.dtype()),
           dtype_name(dst.dtype()));
  if (error_) return;
  const auto threads = on_threads();
  convert(src.dtype(), s, dst.dtype(), d, src.numel());
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = f32(a, "add");
  const float* pb = f32(b, "add");
  float* po = f32(out, "add");
  expect_same_numel(a, b, "add");
  expect_same_numel(a, out, "add");
  if (error_) return;
  const auto threads = on_threads();
  cpu::add(a.numel(), pa, pb, po);
}

void CpuBackend::scale(Tensor& x, float alpha) {
  float* p = f32(x, "scale");
  if (error_) return;
  const auto threads = on_threads();
  cpu::scale(x.numel(), p, alpha);
}

void CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  const float* px = f32(x, "axpy");
  float* py = f32(y, "axpy");
  expect_same_numel(x, y, "axpy");
  if (error_) return;
  const auto threads = on_threads();
  cpu::axpy(x.numel(), alpha, px, py);
}

void CpuBackend::sum(const Tensor& x, Tensor& out, float scale, bool accumulate) {
  const float* px = f32(x, "sum");
  float* po = f32(out, "sum");
  if (out.numel() != 1) misuse("sum: out {} must have one element", out.shape().str());
  if (error_) return;
  const auto threads = on_threads();
  const double s = static_cast<double>(scale) * cpu::sum(x.numel(), px);
  *po = static_cast<float>(accumulate ? static_cast<double>(*po) + s : s);
}

void CpuBackend::sum_squares(const Tensor& x, Tensor& out, bool accumulate) {
  const float* px = f32(x, "sum_squares");
  float* po = f32(out, "sum_squares");
  if (out.numel() != 1) misuse("sum_squares: out {} must have one element", out.shape().str());
  if (error_) return;
  const auto threads = on_threads();
  const double s = cpu::sum_squares(x.numel(), px);
  *po = static_cast<float>(accumulate ? static_cast<double>(*po) + s : s);
}

void CpuBackend::fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) {
  const float* px = f32(x, "fp8_cast");
  float* py = f32(y, "fp8_cast");
  float* pa = f32(amax, "fp8_cast");
  expect_same_numel(x, y, "fp8_cast");
  if (amax.numel() != 1) misuse("fp8_cast: amax {} must have one element", amax.shape().str());
  if (error_) return;
  const std::span<const float> in(px, static_cast<std::size_t>(x.numel()));
  float scale = op.scale;
  if (op.current) scale = current_scale(*pa, op.format);
  else *pa = std::max(*pa, meshtrain::amax(in));
  fp8_quantize(in, scale, op.format, std::span<float>(py, static_cast<std::size_t>(y.numel())));
}

void CpuBackend::amax(const Tensor& x, Tensor& out) {
  const float* px = f32(x, "amax");
  float* po = f32(out, "amax");
  if (out.numel() != 1) misuse("amax: out {} must have one element", out.shape().str());
  if (error_) return;
  *po = std::max(*po, meshtrain::amax(std::span<const float>(px, static_cast<std::size_t>(x.numel()))));
}

// ---- collectives -------------------------------------------------------------------

namespace {
// Collectives move fp32, and ids (i32) bitwise through the same float spans.
void expect_transportable(const Tensor& t, std::string_view op) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::i32)
    misuse("{}: {} tensors are not transported; cast to fp32 first", op, dtype_name(t.dtype()));
}

bool half_width(const Tensor& t) { return t.dtype() == DType::bf16 || t.dtype() == DType::f16; }

// 16-bit tensors (a compressed gradient on the wire) move bitwise by the
// data-movement collectives, two elements to a float of the communicator's
// spans: each block of c elements travels as ceil(c/2) floats, an odd
// block's last float padded with zero bits.
struct HalfBlocks {
  std::vector<std::int64_t> elements, floats;  // per block
  std::vector<float> packed;
  explicit HalfBlocks(std::span<const std::int64_t> counts) {
    std::int64_t total = 0;
    for (std::int64_t c : counts) {
      elements.push_back(c);
      floats.push_back((c + 1) / 2);
      total += floats.back();
    }
    packed.assign(static_cast<std::size_t>(total), 0.f);
  }
  void pack(const std::byte* src) {
    auto* dst = reinterpret_cast<std::byte*>(packed.data());
    for (std::size_t j = 0; j < elements.size(); ++j) {
      std::memcpy(dst, src, static_cast<std::size_t>(elements[j]) * 2);
      src += elements[j] * 2, dst += floats[j] * 4;
    }
  }
  void unpack(std::byte* dst) const {
    const auto* src = reinterpret_cast<const std::byte*>(packed.data());
    for (std::size_t j = 0; j < elements.size(); ++j) {
      std::memcpy(dst, src, static_cast<std::size_t>(elements[j]) * 2);
      dst += elements[j] * 2, src += floats[j] * 4;
    }
  }
  std::span<float> span() { return packed; }
};
}  // namespace

void CpuBackend::check_member(const Group& g, std::string_view op) const {
  if (auto problem = member_problem(g, rank_, op); !problem.empty()) misuse("{}", problem);
}

Communicator& CpuBackend::comm(std::string_view op) const {
  if (comm_ == nullptr) misuse("{}: a group of more than one rank needs a communicator", op);
  return *comm_;
}

void CpuBackend::note(Status status, std::string_view op, const Group& g) {
  if (!status.ok()) note(std::move(status), fmt::format("{} on group {}", op, g.id));
}

void CpuBackend::note(Status status, std::string_view where) {
  if (status.ok()) return;
  Error e = std::move(status).error();
  e.context(fmt::format("cpu rank {}: {}", rank_, where));
  error_ = std::move(e);
}

Status CpuBackend::half_reduce(const Tensor& in, Tensor& out, const Group& g, ReduceOp op, bool all) {
  // Member k's block: [n·k/G, n·(k+1)/G) of an all-reduce, as the communicators cut it; out's k elements
  // at k·|out| of a reduce-scatter.
  const std::int64_t G = g.size(), k = g.index_of(rank_), n = in.numel();
  auto lo = [&](std::int64_t j) { return all ? n * j / G : j * out.numel(); };
  auto len = [&](std::int64_t j) { return lo(j + 1) - lo(j); };
  std::vector<std::int64_t> send(static_cast<std::size_t>(G)), recv(static_cast<std::size_t>(G), len(k));
  for (std::int64_t j = 0; j < G; ++j) send[static_cast<std::size_t>(j)] = len(j);
  HalfBlocks sent(send), received(recv);
  sent.pack(bytes_of(in, "reduce"));
  MT_TRY(comm("reduce").all_to_all(sent.span(), sent.floats, received.span(), received.floats, g));
  std::vector<std::byte> blocks(static_cast<std::size_t>(G * len(k)) * 2);
  received.unpack(blocks.data());
  const DType dt = in.dtype();
  std::vector<float> acc(static_cast<std::size_t>(len(k))), x(acc.size());
  for (std::int64_t q = 0; q < G; ++q) {
    float* dst = q == 0 ? acc.data() : x.data();
    for (std::int64_t i = 0; i < len(k); ++i) dst[i] = load(dt, blocks.data(), q * len(k) + i);
    if (q > 0) comm::combine(acc.data(), x.data(), acc.size(), op);
  }
  std::byte* o = bytes_of(out, "reduce");
  for (std::int64_t i = 0; i < len(k); ++i) store(dt, o, (all ? lo(k) : 0) + i, acc[static_cast<std::size_t>(i)]);
  if (!all) return ok_status();
  // Every member's rounded block to every member.
  std::vector<std::int64_t> mine(static_cast<std::size_t>(G), len(k));
  std::vector<std::byte> copies;
  for (std::int64_t j = 0; j < G; ++j) copies.insert(copies.end(), o + lo(k) * 2, o + lo(k + 1) * 2);
  HalfBlocks own(mine), theirs(send);
  own.pack(copies.data());
  MT_TRY(comm("reduce").all_to_all(own.span(), own.floats, theirs.span(), theirs.floats, g));
  theirs.unpack(o);
  return ok_status();
}

void CpuBackend::all_reduce(Tensor& x, const Group& g, ReduceOp op) {
  check_member(g, "all_reduce");
  if (half_width(x)) {
    if (!error_ && g.size() > 1) note(half_reduce(x, x, g, op, true), "all_reduce", g);
    return;
  }
  float* p = f32(x, "all_reduce");
  if (error_ || g.size() == 1) return;
  note(comm("all_reduce").all_reduce({p, static_cast<std::size_t>(x.numel())}, g, op), "all_reduce",
       g);
}

void CpuBackend::reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) {
  check_member(g, "reduce_scatter");
  if (auto problem = reduce_scatter_problem(in, out, g); !problem.empty()) misuse("{}", problem);
  if (half_width(in) && in.dtype() == out.dtype()) {
    if (error_) return;
    if (g.size() == 1) copy(in, out);
    else note(half_reduce(in, out, g, op, false), "reduce_scatter", g);
    return;
  }
  const float* pi = f32(in, "reduce_scatter");
  float* po = f32(out, "reduce_scatter");
  if (error_) return;
  if (g.size() == 1) {
    copy(in, out);
    return;
  }
  note(comm("reduce_scatter")
           .reduce_scatter({pi, static_cast<std::size_t>(in.numel())},
                           {po, static_cast<std::size_t>(out.numel())}, g, op),
       "reduce_scatter", g);
}

void CpuBackend::all_gather(const Tensor& in, Tensor& out, const Group& g) {
  const auto* pi = reinterpret_cast<const float*>(bytes_of(in, "all_gather"));
  auto* po = reinterpret_cast<float*>(bytes_of(out, "all_gather"));
  if (!half_width(in)) expect_transportable(in, "all_gather");
  check_member(g, "all_gather");
  if (auto problem = all_gather_problem(in, out, g); !problem.empty()) misuse("{}", problem);
  if (error_) return;
  if (g.size() == 1) {
    copy(in, out);
    return;
  }
  if (half_width(in)) {
    const std::vector<std::int64_t> one(1, in.numel()), all(static_cast<std::size_t>(g.size()), in.numel());
    HalfBlocks mine(one), gathered(all);
    mine.pack(bytes_of(in, "all_gather"));
    note(comm("all_gather").all_gather(mine.span(), gathered.span(), g), "all_gather", g);
    if (!error_) gathered.unpack(bytes_of(out, "all_gather"));
    return;
  }
  note(comm("all_gather")
           .all_gather({pi, static_cast<std::size_t>(in.numel())},
                       {po, static_cast<std::size_t>(out.numel())}, g),
       "all_gather", g);
}

void CpuBackend::broadcast(Tensor& x, const Group& g, int root_global_rank) {
  auto* p = reinterpret_cast<float*>(bytes_of(x, "broadcast"));
  expect_transportable(x, "broadcast");
  check_member(g, "broadcast");
  if (auto problem = broadcast_root_problem(g, root_global_rank); !problem.empty())
    misuse("{}", problem);
  if (error_ || g.size() == 1) return;
  note(comm("broadcast").broadcast({p, static_cast<std::size_t>(x.numel())}, g, root_global_rank),
       "broadcast", g);
}

void CpuBackend::all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                            Tensor& out, std::span<const std::int64_t> recv_counts,
                            const Group& g) {
  const auto* pi = reinterpret_cast<const float*>(bytes_of(in, "all_to_all"));
  auto* po = reinterpret_cast<float*>(bytes_of(out, "all_to_all"));
  if (!half_width(in)) expect_transportable(in, "all_to_all");
  check_member(g, "all_to_all");
  if (auto problem = all_to_all_problem(in, send_counts, out, recv_counts, g); !problem.empty())
    misuse("{}", problem);
  if (error_) return;
  if (g.size() == 1) {
    copy(in, out);
    return;
  }
  if (half_width(in)) {
    HalfBlocks sent(send_counts), received(recv_counts);
    sent.pack(bytes_of(in, "all_to_all"));
    note(comm("all_to_all").all_to_all(sent.span(), sent.floats, received.span(), received.floats, g), "all_to_all",
         g);
    if (!error_) received.unpack(bytes_of(out, "all_to_all"));
    return;
  }
  note(comm("all_to_all")
           .all_to_all({pi, static_cast<std::size_t>(in.numel())}, send_counts,
                       {po, static_cast<std::size_t>(out.numel())}, recv_counts, g),
       "all_to_all", g);
}

std::span<float> CpuBackend::point_to_point_buffer(const Tensor& x, int peer_global_rank, std::string_view op) const {
  auto* p = reinterpret_cast<float*>(bytes_of(x, op));
  expect_transportable(x, op);
  if (auto problem = peer_problem(op, peer_global_rank, rank_, world_size_); !problem.empty())
    misuse("{}", problem);
  return {p, static_cast<std::size_t>(x.numel())};
}

void CpuBackend::send(const Tensor& x, int peer_global_rank, int tag) {
  const std::span<const float> data = point_to_point_buffer(x, peer_global_rank, "send");
  if (error_) return;
  note(comm("send").send(data, peer_global_rank, tag), fmt::format("send to rank {} tag {}", peer_global_rank, tag));
}

void CpuBackend::recv(Tensor& x, int peer_global_rank, int tag) {
  const std::span<float> data = point_to_point_buffer(x, peer_global_rank, "recv");
  if (error_) return;
  note(comm("recv").recv(data, peer_global_rank, tag), fmt::format("recv from rank {} tag {}", peer_global_rank, tag));
}

void CpuBackend::barrier(const Group& g) {
  check_member(g, "barrier");
  if (error_ || g.size() == 1) return;
  note(comm("barrier").barrier(g), "barrier", g);
}

}  // namespace meshtrain
