// Vocab-parallel softmax cross-entropy phases: one block per row. Logits (and
// dlogits) of storage type T are read into fp32; the row statistics, target
// logits and losses are fp32.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

template <class T>
__global__ void ce_max_kernel(const T* logits, float* row_max, i64 V) {
  __shared__ float sh[32];
  const T* l = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (i64 j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_float(l[j]));
  m = block_max(m, sh);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T>
__global__ void ce_partials_kernel(const T* logits, const std::int32_t* targets,
                                   const float* row_max, i64 vocab_offset, float* sumexp,
                                   float* target_logit, i64 V) {
  __shared__ double sh[32];
  const i64 r = blockIdx.x;
  const T* l = logits + r * V;
  const float m = row_max[r];
  double z = 0.0;  // exp in fp32, summed in double as the cpu backend does
  for (i64 j = threadIdx.x; j < V; j += blockDim.x)
    z += static_cast<double>(expf(to_float(l[j]) - m));
  z = block_sum(z, sh);
  if (threadIdx.x == 0) {
    sumexp[r] = static_cast<float>(z);
    const i64 t = static_cast<i64>(targets[r]) - vocab_offset;
    target_logit[r] = (t >= 0 && t < V) ? to_float(l[t]) : 0.f;
  }
}

__global__ void ce_loss_kernel(const float* row_max, const float* sumexp, const float* target_logit,
                               float* losses, i64 N) {
  for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < N; r += (i64)gridDim.x * blockDim.x)
    losses[r] = logf(sumexp[r]) + row_max[r] - target_logit[r];
}

// One block: the count of rows whose target logit reaches the row max, an
// integer (exact whatever the order), then one rounding to fp32 as the cpu
// backend does.
__global__ void ce_accuracy_kernel(const float* row_max, const float* target_logit, float* correct,
                                   i64 N, bool accumulate) {
  __shared__ long long sh[32];
  long long hits = 0;
  for (i64 r = threadIdx.x; r < N; r += blockDim.x) hits += target_logit[r] >= row_max[r] ? 1 : 0;
  hits = block_sum(hits, sh);
  if (threadIdx.x == 0) correct[0] = static_cast<float>(hits) + (accumulate ? correct[0] : 0.f);
}

template <class T>
__global__ void ce_backward_kernel(const T* logits, const std::int32_t* targets,
                                   const float* row_max, const float* sumexp, i64 vocab_offset,
                                   float dloss, T* dlogits, i64 V) {
  const i64 r = blockIdx.x;
  const T* l = logits + r * V;
  T* d = dlogits + r * V;
  const float m = row_max[r], inv = 1.f / sumexp[r];
  const i64 t = static_cast<i64>(targets[r]) - vocab_offset;
  for (i64 j = threadIdx.x; j < V; j += blockDim.x) {
    const float g = dloss * (expf(to_float(l[j]) - m) * inv);
    d[j] = from_float<T>(j == t ? g - dloss : g);
  }
}

}  // namespace

cudaError_t ce_max(const void* logits, int dtype, float* row_max, i64 N, i64 V, cudaStream_t s) {
  if (N <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    ce_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(typed(tag, logits), row_max, V);
    return cudaGetLastError();
  });
}
cudaError_t ce_partials(const void* logits, int dtype, const std::int32_t* targets,
                        const float* row_max, i64 vocab_offset, float* sumexp,
                        float* target_logit, i64 N, i64 V, cudaStream_t s) {
  if (N <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    ce_partials_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        typed(tag, logits), targets, row_max, vocab_offset, sumexp, target_logit, V);
    return cudaGetLastError();
  });
}
cudaError_t ce_loss(const float* row_max, const float* sumexp, const float* target_logit,
                    float* losses, i64 N, cudaStream_t s) {
  if (N > 0) ce_loss_kernel<<<grid_for(N), kThreads, 0, s>>>(row_max, sumexp, target_logit, losses, N);
  return cudaGetLastError();
}
cudaError_t ce_accuracy(const float* row_max, const float* target_logit, float* correct, i64 N,
                        bool accumulate, cudaStream_t s) {
  ce_accuracy_kernel<<<1, 1024, 0, s>>>(row_max, target_logit, correct, N < 0 ? 0 : N, accumulate);
  return cudaGetLastError();
}
cudaError_t ce_backward(const void* logits, int dtype, const std::int32_t* targets,
                        const float* row_max, const float* sumexp, i64 vocab_offset, float dloss,
                        void* dlogits, i64 N, i64 V, cudaStream_t s) {
  if (N <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    ce_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        typed(tag, logits), targets, row_max, sumexp, vocab_offset, dloss, typed(tag, dlogits), V);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
