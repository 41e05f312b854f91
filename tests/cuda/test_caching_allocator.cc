// The caching allocator's bookkeeping over a fake host RawMemory.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>

#include "backends/cuda/caching_allocator.h"

using meshtrain::cuda::CachingAllocator;
using meshtrain::cuda::RawMemory;

namespace {
// Host memory with a budget, counting calls.
class FakeRaw final : public RawMemory {
 public:
  explicit FakeRaw(std::size_t budget = std::size_t{1} << 34) : budget_(budget) {}
  ~FakeRaw() override { CHECK(live_.empty()); }
  void* allocate(std::size_t bytes) override {
    if (used_ + bytes > budget_) return nullptr;
    void* p = std::malloc(bytes);
    live_[p] = bytes;
    used_ += bytes;
    ++allocs;
    return p;
  }
  void release(void* p) override {
    REQUIRE(live_.count(p) == 1);
    used_ -= live_[p];
    live_.erase(p);
    std::free(p);
    ++releases;
  }
  int allocs = 0, releases = 0;

 private:
  std::size_t budget_, used_ = 0;
  std::map<void*, std::size_t> live_;
};

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// a.allocate(bytes, stream), which must succeed.
CachingAllocator::Allocation allocated(CachingAllocator& a, std::size_t bytes, int stream = 0) {
  auto r = a.allocate(bytes, stream);
  REQUIRE(r.ok());
  return *r;
}

// An allocator over fake memory of the default budget: what most cases start from.
struct Allocator {
  FakeRaw raw;
  CachingAllocator a{raw};
};
}  // namespace

TEST_CASE("size classes round to 512 bytes and pick segment sizes") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(1 * MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB) == 10 * MiB);
  CHECK(CachingAllocator::segment_size(11 * MiB + 512) == 12 * MiB);
}

TEST_CASE_METHOD(Allocator, "small blocks split one segment and freed blocks are reused") {
  const auto x = allocated(a, 1000);
  const auto y = allocated(a, 3000);
  CHECK(raw.allocs == 1);  // both from one 2 MiB segment
  CHECK(x.size == 1024);
  CHECK(y.size == 3072);
  CHECK(static_cast<char*>(y.ptr) == static_cast<char*>(x.ptr) + 1024);
  auto s = a.stats();
  CHECK(s.live_bytes == 4096);
  CHECK(s.requested_bytes == 4000);
  CHECK(s.reserved_bytes == static_cast<std::int64_t>(2 * MiB));
  void* old = x.ptr;
  a.free(x);
  const auto z = allocated(a, 900);  // best fit: the freed 1 KiB block
  CHECK(z.ptr == old);
  CHECK(raw.allocs == 1);
  a.free(y);
  a.free(z);
  CHECK(a.stats().live_bytes == 0);
}

TEST_CASE_METHOD(Allocator, "a warmed-up step loop makes no raw allocations") {
  auto step = [&] {
    std::vector<CachingAllocator::Allocation> held;
    for (std::size_t sz : {4 * KiB, 3 * MiB, 700 * KiB, 12 * MiB, std::size_t{64}, 3 * MiB}) {
      held.push_back(allocated(a, sz));
    }
    for (auto& h : held) a.free(h);
  };
  step();
  const auto warm = a.stats().raw_allocations;
  for (int i = 0; i < 10; ++i) step();
  CHECK(a.stats().raw_allocations == warm);
  CHECK(a.stats().live_bytes == 0);
}

TEST_CASE_METHOD(Allocator, "peak tracks the maximum live bytes until reset") {
  const auto x = allocated(a, 2 * MiB);
  const auto y = allocated(a, 2 * MiB);
  a.free(x);
  CHECK(a.stats().peak_bytes == static_cast<std::int64_t>(4 * MiB));
  CHECK(a.stats().live_bytes == static_cast<std::int64_t>(2 * MiB));
  a.reset_peak();
  CHECK(a.stats().peak_bytes == static_cast<std::int64_t>(2 * MiB));
  a.free(y);
}

TEST_CASE_METHOD(Allocator, "freed neighbours merge, fragmentation measures scattered free memory") {
  std::vector<CachingAllocator::Allocation> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(allocated(a, 128 * KiB));
  }
  // Free every other block: the free memory is 4 holes plus the segment tail.
  for (int i = 0; i < 8; i += 2) a.free(blocks[static_cast<std::size_t>(i)]);
  const auto holes = a.stats();
  const double tail = 2.0 * MiB - 8 * 128.0 * KiB;
  const double free_bytes = tail + 4 * 128.0 * KiB;
  CHECK(holes.fragmentation == Approx(1.0 - tail / free_bytes));
  // Freeing the rest merges everything back into one block.
  for (int i = 1; i < 8; i += 2) a.free(blocks[static_cast<std::size_t>(i)]);
  CHECK(a.stats().fragmentation == 0.0);
  const auto whole = allocated(a, 1 * MiB);  // fits only if the blocks merged in place
  CHECK(whole.ptr == blocks[0].ptr);
  CHECK(raw.allocs == 1);
  a.free(whole);
}

TEST_CASE_METHOD(Allocator, "streams keep separate pools") {
  const auto x = allocated(a, 4 * KiB);
  a.free(x);
  const auto y = allocated(a, 4 * KiB, 1);  // stream 1 may not take stream 0's block
  CHECK(raw.allocs == 2);
  a.free(y);
}

TEST_CASE_METHOD(Allocator, "free_when blocks wait for their predicate") {
  const auto x = allocated(a, 3 * MiB);
  bool done = false;
  a.free_when(x, [&] { return done; });
  CHECK(a.stats().pending_blocks == 1);
  CHECK(a.stats().live_bytes == 0);
  const auto y = allocated(a, 3 * MiB);  // the pending block may not be handed out
  CHECK(y.ptr != x.ptr);
  done = true;
  a.free(y);
  const auto z = allocated(a, 3 * MiB);  // polled now: the old block is back
  CHECK(a.stats().pending_blocks == 0);
  a.free(z);
}

TEST_CASE("out of memory releases cached segments, then fails with numbers") {
  FakeRaw raw(24 * MiB);
  CachingAllocator a(raw);
  const auto x = allocated(a, 20 * MiB);
  a.free(x);  // cached, not returned
  const auto y = allocated(a, 2 * KiB);  // needs a new 2 MiB segment: fits beside the cache
  const auto big = allocated(a, 21 * MiB);  // must release the cached 20 MiB first
  CHECK(raw.releases == 1);
  auto fail = a.allocate(21 * MiB, 0);
  REQUIRE_FALSE(fail.ok());
  CHECK_THAT(fail.error().message(), Catch::Contains("out of device memory"));
  a.free(y);
  a.free(big);
  a.release_cached();
  CHECK(a.stats().reserved_bytes == 0);
}
