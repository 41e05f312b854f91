// Whole-tensor sums and AdamW over one tensor or a list of them in one
// launch: the optimizer phase of a step runs one launch per gradient bucket
// instead of one or two per tensor. A single tensor is a list of one, so the
// per-tensor op and the multi-tensor one give the same bits by construction.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {

i64 reduce_blocks(i64 n) {
  const i64 b = (n + kThreads - 1) / kThreads;
  return b < 1 ? 1 : b > kReduceBlocks ? kReduceBlocks : b;
}

namespace {

// Which entry block `block` belongs to: first[k] <= block < first[k + 1].
__device__ __forceinline__ int entry_of(const int* first, int count, int block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The tensors of one sum; first[k] is tensor k's first block (prefix sums of
// reduce_blocks), first[count] the grid size. Kernels take their table as a
// __grid_constant__ parameter: indexed in place, where a plain parameter
// whose address is taken would be copied to each thread's local memory.
struct ReduceTable {
  const void* x[kMaxForeach];
  i64 n[kMaxForeach];
  int dtype[kMaxForeach];
  int first[kMaxForeach + 1];
  int count;
};

// Block b of a tensor's nb blocks: its threads' grid-stride elements, in
// double, in a fixed order. FMA for squares keeps one rounding per element
// (written out, so it cannot depend on what the compiler contracts).
template <class T>
__device__ double partial_sum(const T* x, i64 n, int b, int nb, bool squares) {
  double acc = 0.0;
  for (i64 i = b * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)nb * blockDim.x) {
    const double v = static_cast<double>(to_float(x[i]));
    acc = squares ? __fma_rn(v, v, acc) : __dadd_rn(acc, v);
  }
  return acc;
}

// Pass 1: one partial per block.
__global__ void reduce_partials(const __grid_constant__ ReduceTable t, bool squares, double* partials) {
  __shared__ double sh[32];
  const int k = entry_of(t.first, t.count, blockIdx.x);
  const int b = blockIdx.x - t.first[k], nb = t.first[k + 1] - t.first[k];
  double acc = 0.0;
  switch (t.dtype[k]) {  // uniform over the block
    case 0: acc = partial_sum(static_cast<const float*>(t.x[k]), t.n[k], b, nb, squares); break;
    case 1: acc = partial_sum(static_cast<const __nv_bfloat16*>(t.x[k]), t.n[k], b, nb, squares); break;
    default: acc = partial_sum(static_cast<const __half*>(t.x[k]), t.n[k], b, nb, squares); break;
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2 (one block of kReduceBlocks threads): each tensor's partials in one
// tree, then onto out in tensor order, rounded to fp32 after each as
// separate per-tensor calls would.
__global__ void reduce_finish(const double* partials, const __grid_constant__ ReduceTable t, float scale,
                              bool accumulate, float* out) {
  __shared__ double sh[32];
  float o = accumulate ? *out : 0.f;
  for (int k = 0; k < t.count; ++k) {
    const int nb = t.first[k + 1] - t.first[k];
    const double acc =
        block_sum(static_cast<int>(threadIdx.x) < nb ? partials[t.first[k] + threadIdx.x] : 0.0, sh);
    const double s = static_cast<double>(scale) * acc;
    o = static_cast<float>(accumulate || k > 0 ? static_cast<double>(o) + s : s);
  }
  if (threadIdx.x == 0) *out = o;
}

// The cpu backend's AdamW update of one element (backends/cpu/kernels/
// optimizer.h, built with -ffp-contract=off), operation for operation: each
// product and sum rounded on its own, so nvcc cannot fuse a·b + c into an FMA
// whose single rounding would change the last bit (and, through a bf16
// working copy, a whole bf16 step of a weight).
__device__ __forceinline__ void adamw_element(float& param, float grad, float& m, float& v, float cf,
                                              const AdamWArgs& a, float decay) {
  const float g = __fmul_rn(grad, cf);
  const float mi = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(__fsub_rn(1.f, a.beta1), g));
  const float vi = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, a.beta2), g), g));
  m = mi;
  v = vi;
  const float step = __fdiv_rn(__fmul_rn(a.lr, __fmul_rn(mi, a.c1)), __fadd_rn(__fsqrt_rn(__fmul_rn(vi, a.c2)), a.eps));
  param = __fsub_rn(__fmul_rn(param, decay), step);
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, const float* coef,
                             i64 n, AdamWArgs a) {
  const float cf = coef ? *coef : 1.f;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    adamw_element(param[i], grad[i], m[i], v[i], cf, a, a.decay);
}

// Elements per block of the multi-tensor AdamW: a block's threads stride
// through one chunk of one tensor.
constexpr i64 kAdamWChunk = 16 * kThreads;

struct AdamWTable {
  AdamWTensor t[kMaxForeach];
  int first[kMaxForeach + 1];  // tensor k's chunks are blocks [first[k], first[k + 1])
  int count;
};

__global__ void foreach_adamw_kernel(const __grid_constant__ AdamWTable t, const float* coef, AdamWArgs a) {
  const float cf = coef ? *coef : 1.f;
  const int k = entry_of(t.first, t.count, blockIdx.x);
  const AdamWTensor& x = t.t[k];
  const i64 begin = (blockIdx.x - t.first[k]) * kAdamWChunk;
  const i64 end = begin + kAdamWChunk < x.n ? begin + kAdamWChunk : x.n;
  for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x)
    adamw_element(x.param[i], x.grad[i], x.m[i], x.v[i], cf, a, x.decay);
}

}  // namespace

cudaError_t reduce_sum(const ReduceInput* xs, int count, bool squares, float scale, bool accumulate,
                       float* out, double* scratch, cudaStream_t s) {
  if (count < 1 || count > kMaxForeach) return cudaErrorInvalidValue;
  ReduceTable t{};
  t.count = count;
  t.first[0] = 0;
  for (int k = 0; k < count; ++k) {
    if (xs[k].dtype < 0 || xs[k].dtype > 2) return cudaErrorInvalidValue;
    t.x[k] = xs[k].x;
    t.n[k] = xs[k].n;
    t.dtype[k] = xs[k].dtype;
    t.first[k + 1] = t.first[k] + static_cast<int>(reduce_blocks(xs[k].n));
  }
  reduce_partials<<<t.first[count], kThreads, 0, s>>>(t, squares, scratch);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  reduce_finish<<<1, kReduceBlocks, 0, s>>>(scratch, t, scale, accumulate, out);
  return cudaGetLastError();
}

cudaError_t adamw(float* param, const float* grad, float* m, float* v, const float* coef, i64 n,
                  const AdamWArgs& a, cudaStream_t s) {
  if (n > 0) adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(param, grad, m, v, coef, n, a);
  return cudaGetLastError();
}

cudaError_t foreach_adamw(const AdamWTensor* ts, int count, const float* coef, const AdamWArgs& a,
                          cudaStream_t s) {
  if (count < 0 || count > kMaxForeach) return cudaErrorInvalidValue;
  AdamWTable t{};
  t.first[0] = 0;
  i64 blocks = 0;
  for (int k = 0; k < count; ++k) {
    if (ts[k].n <= 0) continue;  // no chunk: never looked up
    t.t[t.count] = ts[k];
    t.first[t.count] = static_cast<int>(blocks);
    blocks += (ts[k].n + kAdamWChunk - 1) / kAdamWChunk;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;  // > 2^31 blocks: 8.8e12 elements
    t.first[++t.count] = static_cast<int>(blocks);
  }
  if (blocks > 0) foreach_adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(t, coef, a);
  return cudaGetLastError();
}

}  // namespace meshtrain::cuda::kernels
