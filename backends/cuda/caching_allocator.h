// A caching allocator for device memory, as PyTorch's: segments obtained from
// the device once are cut into blocks, freed blocks go back to per-stream
// pools and are reused, so the training step loop performs no cudaMalloc after
// warm-up (raw_allocations stops growing).
//
// The bookkeeping knows nothing of CUDA: it calls a RawMemory, which the cuda
// backend implements with cudaMalloc/cudaFree and the tests with host memory.
//
// Rules:
//  * Sizes round up to 512 bytes. Requests up to 1 MiB come from 2 MiB "small"
//    segments; larger ones from "large" segments of 20 MiB (requests under
//    10 MiB) or the request rounded up to 2 MiB. A block is split when the
//    remainder is worth keeping (>= 512 bytes small, > 1 MiB large); freed
//    neighbours within a segment merge again.
//  * Each segment belongs to the stream that first needed it. A block freed
//    with free() is reusable at once by later work on that stream (stream
//    order makes that safe); one freed with free_when() waits until its
//    predicate says the other streams that used it are done.
//  * When the device refuses memory, wholly free cached segments are returned
//    and the request retried once before it fails.
//  * Thread-safe: storage handles may be dropped on any thread; `mu_` guards
//    all state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "core/status.h"

namespace meshtrain::cuda {

class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* allocate(std::size_t bytes) = 0;  // nullptr when out of memory
  virtual void release(void* p) = 0;
};

struct AllocatorStats {
  std::int64_t live_bytes = 0;       // bytes of blocks handed out (rounded sizes)
  std::int64_t requested_bytes = 0;  // bytes asked for by the live blocks
  std::int64_t peak_bytes = 0;       // max of live_bytes since reset_peak
  std::int64_t reserved_bytes = 0;   // bytes of segments held from RawMemory
  std::int64_t raw_allocations = 0;  // RawMemory::allocate calls that succeeded, ever
  std::int64_t pending_blocks = 0;   // freed blocks waiting on free_when predicates
  // 1 - (largest free block / free cached bytes): 0 when the free memory is one
  // block (or none), near 1 when it is scattered in small pieces.
  double fragmentation = 0.0;
};

class CachingAllocator {
 public:
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    int stream = 0;
    bool small = false;      // which pool (and segment kind) it belongs to
    bool allocated = false;  // handed out, or pending
    Block* prev = nullptr;   // neighbours within the segment
    Block* next = nullptr;
  };
  struct Allocation {
    void* ptr = nullptr;
    std::size_t size = 0;  // the block's (rounded) size
    Block* block = nullptr;
  };

  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallRequest = 1 << 20;
  static constexpr std::size_t kSmallSegment = 2 << 20;
  static constexpr std::size_t kLargeSegment = 20 << 20;
  static constexpr std::size_t kRoundLarge = 2 << 20;
  static constexpr std::size_t kMidRequest = 10 << 20;

  explicit CachingAllocator(RawMemory& raw) : raw_(raw) {}
  // Returns every segment to RawMemory: destroy only when no block is in use.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static std::size_t round_size(std::size_t bytes);
  // The size of the segment a request of `rounded` bytes would create.
  static std::size_t segment_size(std::size_t rounded);

  // bytes == 0 gives a minimal block (a distinct pointer).
  Result<Allocation> allocate(std::size_t bytes, int stream);
  void free(const Allocation& a);
  void free_when(const Allocation& a, std::function<bool()> ready);
  // Returns wholly free segments to RawMemory (pending blocks are polled first).
  void release_cached();

  AllocatorStats stats() const;
  void reset_peak();

 private:
  struct ByKey {  // best fit: (stream, size, address)
    bool operator()(const Block* a, const Block* b) const {
      return std::tie(a->stream, a->size, a->addr) < std::tie(b->stream, b->size, b->addr);
    }
  };
  using Pool = std::set<Block*, ByKey>;

  Pool& pool_of(const Block* b) { return b->small ? small_ : large_; }
  Block* take_from_pool(Pool& pool, std::size_t size, int stream);
  void return_block(Block* b);  // marks free, merges neighbours, pools it
  // Merges b's next block (out of any pool) into b, which keeps its address, and frees its record.
  static void absorb_next(Block* b);
  void poll_pending();
  void release_free_segments();

  RawMemory& raw_;
  mutable std::mutex mu_;  // guards everything below
  Pool small_, large_;
  std::vector<Block*> segments_;  // first block of each segment
  struct Pending {
    Block* block;
    std::function<bool()> ready;
  };
  std::vector<Pending> pending_;
  std::int64_t live_ = 0, requested_ = 0, peak_ = 0, reserved_ = 0, raw_allocations_ = 0;
};

}  // namespace meshtrain::cuda
