// What the storages of a CudaBackend share with it and may outlive it with:
// the device, the allocator and the streams (a storage freed late still needs
// the streams that used it). Host-only (g++) header.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/caching_allocator.h"

namespace meshtrain::cuda {

class CudaRawMemory final : public RawMemory {
 public:
  explicit CudaRawMemory(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override;
  void release(void* p) override;

 private:
  int device_;
};

class DeviceState {
 public:
  explicit DeviceState(int device) : device(device), raw(device), allocator(raw) {}
  ~DeviceState();  // after the last storage: destroys streams and events
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  const int device;
  CudaRawMemory raw;
  CachingAllocator allocator;
  std::vector<cudaStream_t> streams;  // Stream id -> handle; written by the issuing thread only
  std::vector<cudaEvent_t> events;    // the event ring, created lazily
  std::vector<cudaEvent_t> timing;    // the ring of timing events (timed_event), created lazily
  // Page-locked host memory (host_zeros) in use, and its peak since reset_peak.
  std::atomic<std::int64_t> host_live{0};  // host storage may be freed on any thread
  std::int64_t host_peak = 0;              // written by the issuing thread only
};

class CudaStorage final : public Storage {
 public:
  CudaStorage(std::shared_ptr<DeviceState> state, CachingAllocator::Allocation a,
              std::size_t bytes, int stream)
      : state_(std::move(state)), alloc_(a), bytes_(bytes), used_(1ull << stream), stream_(stream) {}
  // Page-locked host memory from cudaHostAlloc (host_zeros): `a` holds only the pointer.
  struct Pinned {};
  CudaStorage(std::shared_ptr<DeviceState> state, void* pinned, std::size_t bytes, Pinned)
      : state_(std::move(state)), alloc_{pinned, bytes, nullptr}, bytes_(bytes), used_(1), stream_(0), host_(true) {}
  ~CudaStorage() override;
  CudaStorage(const CudaStorage&) = delete;
  CudaStorage& operator=(const CudaStorage&) = delete;

  const DeviceState* owner() const { return state_.get(); }
  std::byte* data() const { return static_cast<std::byte*>(alloc_.ptr); }
  std::size_t bytes() const { return bytes_; }
  void mark_used(int stream) { used_ |= 1ull << stream; }
  bool host() const { return host_; }

 private:
  std::shared_ptr<DeviceState> state_;
  CachingAllocator::Allocation alloc_;
  std::size_t bytes_;
  std::uint64_t used_;  // bit s: stream s has work on this storage
  int stream_;          // the stream it was allocated for
  bool host_ = false;   // page-locked host memory, not the allocator's
};

}  // namespace meshtrain::cuda
