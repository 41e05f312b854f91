// Fixed-partition parallel loops and reductions for the cpu kernels.
//
// Work is cut into chunks whose boundaries depend only on the problem size,
// never on the number of threads; reductions sum per-chunk partials (in
// double) sequentially in chunk order. That is what makes every kernel give
// identical bits whatever the thread count (the backend's arena, or what
// tbb::global_control allows).
//
// Which threads: a backend runs each op inside a ThreadScope naming its
// rank's task arena, and every parallel loop of the op runs there; without a
// scope (kernels called directly, as the tests' fp64 references are) loops
// run in the calling thread's current arena.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace meshtrain::cpu {

// Elements per task: large enough that TBB's overhead (~1 µs) is noise.
inline constexpr std::int64_t kGrain = 16384;

// ThreadSanitizer cannot see the synchronisation inside libtbb (not
// instrumented) and reports TBB's own task objects as races. A TSan build
// (./setup.sh test --sanitize thread) therefore runs the chunks in order on
// the calling thread: the partition, and so every bit, is the same, and TSan
// checks meshtrain's own threads (ranks as threads, the communicators).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kSerialChunks = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kSerialChunks = true;
#else
inline constexpr bool kSerialChunks = false;
#endif
#else
inline constexpr bool kSerialChunks = false;
#endif

// The arena of the op running on this thread (ThreadScope); null outside one,
// and inside the arena itself (loops nested in a parallel loop run where they are).
inline thread_local tbb::task_arena* t_arena = nullptr;

// Parallel loops of the ops issued on this thread while the scope lives run
// on `arena`'s threads (null: the current arena). Scopes nest.
class ThreadScope {
 public:
  explicit ThreadScope(tbb::task_arena* arena) : previous_(t_arena) { t_arena = arena; }
  ~ThreadScope() { t_arena = previous_; }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  tbb::task_arena* previous_;
};

// Calls f(begin, end) for the fixed chunks [i·chunk, min(n, (i+1)·chunk)).
template <class F>
void for_chunks(std::int64_t n, std::int64_t chunk, F&& f) {
  if (n <= 0) return;
  chunk = std::max<std::int64_t>(chunk, 1);
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 1 || kSerialChunks) {
    for (std::int64_t c = 0; c < chunks; ++c) f(c * chunk, std::min(n, (c + 1) * chunk));
    return;
  }
  auto loop = [&] {
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, chunks, 1),
        [&](const tbb::blocked_range<std::int64_t>& r) {
          for (std::int64_t c = r.begin(); c != r.end(); ++c)
            f(c * chunk, std::min(n, (c + 1) * chunk));
        },
        tbb::simple_partitioner());
  };
  if (tbb::task_arena* arena = t_arena) {
    const ThreadScope inside(nullptr);
    if (arena->max_concurrency() == 1) {  // one thread: the loop, without entering the arena
      for (std::int64_t c = 0; c < chunks; ++c) f(c * chunk, std::min(n, (c + 1) * chunk));
      return;
    }
    arena->execute(loop);
  } else {
    loop();
  }
}

// Chunk [begin, end) of array `array` among several arrays, each cut into the
// kGrain chunks for_chunks would give it alone.
struct ArrayChunk {
  std::size_t array;
  std::int64_t begin, end;
};
template <class Size>
std::vector<ArrayChunk> array_chunks(std::size_t arrays, Size&& size_of) {
  std::vector<ArrayChunk> out;
  for (std::size_t a = 0; a < arrays; ++a) {
    const std::int64_t n = size_of(a);
    for (std::int64_t b = 0; b < n; b += kGrain) out.push_back({a, b, std::min(n, b + kGrain)});
  }
  return out;
}

// Rows of `cols` elements, grouped so that a task holds about kGrain elements.
inline std::int64_t rows_per_chunk(std::int64_t cols) {
  return std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(cols, 1));
}

template <class F>
void for_rows(std::int64_t rows, std::int64_t cols, F&& f) {  // f(row)
  for_chunks(rows, rows_per_chunk(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) f(r);
  });
}

// Σ over [0, n) of partial(begin, end) -> double, in fixed chunk order.
template <class F>
double reduce_chunks(std::int64_t n, F&& partial) {
  if (n <= 0) return 0.0;
  const std::int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> parts(static_cast<std::size_t>(chunks));
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    parts[static_cast<std::size_t>(b / kGrain)] = partial(b, e);
  });
  double s = 0.0;
  for (double p : parts) s += p;
  return s;
}

// Column sums over rows: out (cols) += Σ_r contribution of row r, where
// add_row(r, acc) adds row r's contribution into acc (cols doubles). Rows are
// grouped in fixed chunks (at least 32 rows, bounding the scratch to
// rows·cols/32 doubles); chunk partials are combined in chunk order.
template <class F>
void reduce_rows(std::int64_t rows, std::int64_t cols, F&& add_row, double* out) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t chunk = std::max<std::int64_t>(32, rows_per_chunk(cols));
  const std::int64_t chunks = (rows + chunk - 1) / chunk;
  std::vector<double> parts(static_cast<std::size_t>(chunks * cols), 0.0);
  for_chunks(rows, chunk, [&](std::int64_t b, std::int64_t e) {
    double* acc = parts.data() + (b / chunk) * cols;
    for (std::int64_t r = b; r < e; ++r) add_row(r, acc);
  });
  for (std::int64_t c = 0; c < chunks; ++c) {
    const double* p = parts.data() + c * cols;
    for (std::int64_t j = 0; j < cols; ++j) out[j] += p[j];
  }
}

}  // namespace meshtrain::cpu
