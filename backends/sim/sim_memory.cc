// SimBackend storage and memory accounting: shape-only tensors whose bytes
// count as live from allocation until their last handle goes.
#include "backends/sim/sim_backend.h"

#include <algorithm>
#include <memory>

#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;

namespace {

class SimStorage final : public Storage {
 public:
  SimStorage(std::shared_ptr<SimBackend::Accounting> accounting, std::int64_t bytes, bool host)
      : accounting_(std::move(accounting)), bytes_(bytes), host_(host) {
    live() += bytes_;
    accounting_->peak = std::max(accounting_->peak, accounting_->live);
    accounting_->host_peak = std::max(accounting_->host_peak, accounting_->host_live);
  }
  ~SimStorage() override { live() -= bytes_; }
  SimStorage(const SimStorage&) = delete;
  SimStorage& operator=(const SimStorage&) = delete;
  const SimBackend::Accounting* owner() const { return accounting_.get(); }
  bool host() const { return host_; }

 private:
  std::int64_t& live() { return host_ ? accounting_->host_live : accounting_->live; }

  std::shared_ptr<SimBackend::Accounting> accounting_;
  std::int64_t bytes_;
  bool host_;
};

}  // namespace

namespace {

// Shape-only storage of `shape` in device or host memory, counted by `accounting`.
Tensor allocate(const std::shared_ptr<SimBackend::Accounting>& accounting, const Shape& shape, DType dtype, bool host,
                const char* op) {
  for (auto d : shape.dims())
    if (d < 0) misuse("{}: negative dimension in {}", op, shape.str());
  const auto bytes =
      static_cast<std::int64_t>(shape.numel()) * static_cast<std::int64_t>(dtype_size(dtype));
  return Tensor(std::make_shared<SimStorage>(accounting, bytes, host), shape, dtype);
}

}  // namespace

Tensor SimBackend::empty(const Shape& shape, DType dtype) { return allocate(accounting_, shape, dtype, false, "empty"); }

Tensor SimBackend::zeros(const Shape& shape, DType dtype) { return empty(shape, dtype); }

Tensor SimBackend::host_zeros(const Shape& shape, DType dtype) {
  return allocate(accounting_, shape, dtype, true, "host_zeros");
}

bool SimBackend::on_host(const Tensor& t) const {
  auto* s = dynamic_cast<const SimStorage*>(t.storage());
  return s != nullptr && s->host();
}

void SimBackend::init_normal(Tensor& x, const NormalInitOp&) { check(x, "init_normal"); }

MemoryStats SimBackend::memory_stats() const {
  return {accounting_->live, accounting_->peak, accounting_->host_live, accounting_->host_peak};
}

void SimBackend::reset_peak() {
  accounting_->peak = accounting_->live;
  accounting_->host_peak = accounting_->host_live;
}

void SimBackend::check(const Tensor& t, const char* op) const {
  if (!t.defined()) misuse("{}: undefined tensor", op);
  auto* s = dynamic_cast<const SimStorage*>(t.storage());
  if (s == nullptr || s->owner() != accounting_.get())
    misuse("{}: tensor belongs to another backend (rank {} got a foreign tensor)", op, rank_);
  if (s->host() && !takes_host_memory(op))
    misuse("{}: a tensor {} in host memory (host_zeros), which only copy, write, read and foreach_adamw take", op,
           t.shape().str());
}

void SimBackend::write(Tensor& dst, std::span<const float> host) {
  check(dst, "write");
  if (host.size() != static_cast<std::size_t>(dst.numel()))
    misuse("write: {} host values for a tensor of {}", host.size(), dst.numel());
}

void SimBackend::write(Tensor& dst, std::span<const std::int32_t> host) {
  check(dst, "write");
  if (host.size() != static_cast<std::size_t>(dst.numel()))
    misuse("write: {} host values for a tensor of {}", host.size(), dst.numel());
}

Status SimBackend::read(const Tensor& src, std::span<float> host) {
  check(src, "read");
  if (host.size() != static_cast<std::size_t>(src.numel()))
    misuse("read: host span of {} for a tensor of {}", host.size(), src.numel());
  std::fill(host.begin(), host.end(), 0.f);
  if (cluster_.error_) return *cluster_.error_;
  return ok_status();
}

}  // namespace meshtrain
