#include "backends/cpu/kernels/normal.h"

#include <algorithm>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

// GCC resolves target_clones through an ifunc while the program is being
// relocated, before ThreadSanitizer's runtime has started; the instrumented
// resolver then crashes every binary that links this file. TSan builds take
// the default clone (the same results: normal.h).
#if defined(__SANITIZE_THREAD__)
#define MESHTRAIN_NORMAL_CLONES
#else
#define MESHTRAIN_NORMAL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

MESHTRAIN_NORMAL_CLONES
std::int64_t normal_fill(std::uint64_t key, std::uint64_t first, std::int64_t n, double stddev, float* out) {
  std::int64_t drawn = 0;
  for (std::int64_t b = 0; b < n; b += kNormalBlock)
    drawn += normal_fill_block(key, first + static_cast<std::uint64_t>(b), std::min(kNormalBlock, n - b), stddev,
                               out + b);
  return drawn;
}

void init_normal(const NormalInitOp& op, std::int64_t numel, float* x) {
  const std::int64_t cols = op.cols;
  for_chunks(numel, kGrain, [&](std::int64_t begin, std::int64_t end) {
    // Row by row through [begin, end): the runs' part of it drawn, the gaps zeroed.
    for (std::int64_t pos = begin; pos < end;) {
      const std::int64_t r = pos / cols, c0 = pos % cols, c1 = std::min(cols, c0 + (end - pos));
      float* row = x + r * cols;
      std::int64_t c = c0;
      for (const NormalInitOp::Run& run : op.runs) {
        const std::int64_t a = std::max(c, run.col), e = std::min(c1, run.col + run.width);
        if (a >= e) continue;
        std::fill(row + c, row + a, 0.f);
        normal_fill(op.key, run.counter + static_cast<std::uint64_t>(r) * op.row_stride + static_cast<std::uint64_t>(a - run.col),
                    e - a, op.stddev, row + a);
        c = e;
      }
      std::fill(row + c, row + c1, 0.f);
      pos += c1 - c0;
    }
  });
}

}  // namespace meshtrain::cpu
