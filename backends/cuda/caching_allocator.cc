#include "backends/cuda/caching_allocator.h"

#include <algorithm>

#include "backends/allocation_failure.h"

namespace meshtrain::cuda {

CachingAllocator::~CachingAllocator() {
  for (Block* head : segments_) {
    raw_.release(reinterpret_cast<void*>(head->addr));
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes < kMinBlock) return kMinBlock;
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

std::size_t CachingAllocator::segment_size(std::size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kMidRequest) return kLargeSegment;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::Block* CachingAllocator::take_from_pool(Pool& pool, std::size_t size, int stream) {
  Block probe;
  probe.stream = stream;
  probe.size = size;
  auto it = pool.lower_bound(&probe);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

Result<CachingAllocator::Allocation> CachingAllocator::allocate(std::size_t bytes, int stream) {
  std::lock_guard lock(mu_);
  poll_pending();
  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_ : large_;
  Block* b = take_from_pool(pool, size, stream);
  if (b == nullptr) {
    const std::size_t seg = segment_size(size);
    void* p = raw_.allocate(seg);
    if (p == nullptr) {
      release_free_segments();
      p = raw_.allocate(seg);
    }
    if (p == nullptr)
      return make_error("{} ({} live, {} reserved)",
                        allocation_failure_message("device", bytes, fmt::format("a segment of {}", seg)), live_,
                        reserved_);
    ++raw_allocations_;
    reserved_ += static_cast<std::int64_t>(seg);
    b = new Block{reinterpret_cast<std::uintptr_t>(p), seg, 0, stream, small, false, nullptr, nullptr};
    segments_.push_back(b);
  }
  // Split off the tail when it is worth keeping as a block of its own.
  const std::size_t rest = b->size - size;
  if (small ? rest >= kMinBlock : rest > kSmallRequest) {
    auto* tail = new Block{b->addr + size, rest, 0, stream, small, false, b, b->next};
    if (b->next) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    pool.insert(tail);
  }
  b->allocated = true;
  b->requested = bytes;
  live_ += static_cast<std::int64_t>(b->size);
  requested_ += static_cast<std::int64_t>(bytes);
  peak_ = std::max(peak_, live_);
  return Allocation{reinterpret_cast<void*>(b->addr), b->size, b};
}

void CachingAllocator::absorb_next(Block* b) {
  Block* n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next) n->next->prev = b;
  delete n;
}

void CachingAllocator::return_block(Block* b) {
  b->allocated = false;
  Pool& pool = pool_of(b);
  // Merge with free neighbours; the merged block keeps the lower address.
  if (b->prev && !b->prev->allocated) {
    Block* p = b->prev;
    pool.erase(p);
    absorb_next(p);  // frees b
    b = p;
  }
  if (b->next && !b->next->allocated) {
    pool.erase(b->next);
    absorb_next(b);
  }
  pool.insert(b);
}

void CachingAllocator::free(const Allocation& a) {
  std::lock_guard lock(mu_);
  live_ -= static_cast<std::int64_t>(a.block->size);
  requested_ -= static_cast<std::int64_t>(a.block->requested);
  return_block(a.block);
}

void CachingAllocator::free_when(const Allocation& a, std::function<bool()> ready) {
  std::lock_guard lock(mu_);
  live_ -= static_cast<std::int64_t>(a.block->size);
  requested_ -= static_cast<std::int64_t>(a.block->requested);
  pending_.push_back(Pending{a.block, std::move(ready)});
}

void CachingAllocator::poll_pending() {
  auto done = std::stable_partition(pending_.begin(), pending_.end(),
                                    [](Pending& p) { return !p.ready(); });
  for (auto it = done; it != pending_.end(); ++it) return_block(it->block);
  pending_.erase(done, pending_.end());
}

void CachingAllocator::release_free_segments() {
  std::vector<Block*> kept;
  for (Block* head : segments_) {
    if (head->allocated || head->next != nullptr) {  // in use, or split (hence partly in use)
      kept.push_back(head);
      continue;
    }
    pool_of(head).erase(head);
    reserved_ -= static_cast<std::int64_t>(head->size);
    raw_.release(reinterpret_cast<void*>(head->addr));
    delete head;
  }
  segments_ = std::move(kept);
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mu_);
  poll_pending();
  release_free_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  AllocatorStats s;
  s.live_bytes = live_;
  s.requested_bytes = requested_;
  s.peak_bytes = peak_;
  s.reserved_bytes = reserved_;
  s.raw_allocations = raw_allocations_;
  s.pending_blocks = static_cast<std::int64_t>(pending_.size());
  std::size_t free_bytes = 0, largest = 0;
  for (const Pool* pool : {&small_, &large_})
    for (const Block* b : *pool) {
      free_bytes += b->size;
      largest = std::max(largest, b->size);
    }
  if (free_bytes > 0)
    s.fragmentation = 1.0 - static_cast<double>(largest) / static_cast<double>(free_bytes);
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  peak_ = live_;
}

}  // namespace meshtrain::cuda
