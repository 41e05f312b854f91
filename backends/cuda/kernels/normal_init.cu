// Backend::init_normal on the device: each element evaluates
// backends/counter_rng.h's normal_at for its counter, so the draw needs no
// host loop, no host buffer and no copy (a 1.2B-parameter model took 37 s on
// one host thread), and is written in x's storage type directly.
#include "backends/counter_rng.h"
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

// a is __grid_constant__: its runs are indexed in place, not copied per thread.
__global__ void init_normal_kernel(void* x, int dtype, i64 n, const __grid_constant__ NormalInitArgs a) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 r = i / a.cols, c = i % a.cols;
    // The last run starting at or before c (runs are sorted by col).
    int lo = 0, hi = a.nruns - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.runs[mid].col <= c) lo = mid;
      else hi = mid - 1;
    }
    const NormalRun& run = a.runs[lo];
    if (a.nruns > 0 && run.col <= c && c < run.col + run.width) {
      // As Backend::init_normal: the product in double, rounded once to fp32,
      // then (16-bit storage) once more, to nearest even, as write() does.
      const std::uint64_t counter = run.counter + static_cast<std::uint64_t>(r) * a.row_stride +
                                    static_cast<std::uint64_t>(c - run.col);
      store_float(x, dtype, i, static_cast<float>(a.stddev * normal_at(a.key, counter)));
    } else if (a.zero_rest) {
      store_float(x, dtype, i, 0.f);
    }
  }
}

}  // namespace

cudaError_t init_normal(void* x, int dtype, i64 n, const NormalInitArgs& a, cudaStream_t s) {
  if (a.cols <= 0 || a.nruns < 0 || a.nruns > kMaxNormalRuns || dtype < 0 || dtype > 2)
    return cudaErrorInvalidValue;
  if (n > 0) init_normal_kernel<<<grid_for(n), kThreads, 0, s>>>(x, dtype, n, a);
  return cudaGetLastError();
}

}  // namespace meshtrain::cuda::kernels
