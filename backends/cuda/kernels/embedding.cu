// Embedding lookup and its deterministic gradient. Backward runs one block per
// vocabulary row: the block scans the ids in tiles and, for a tile holding the
// row's id, adds the matching tokens' gradients in token order. No atomics,
// no sort, one write per touched row; rows nobody uses cost one scan of the
// ids (which stay in cache). The table and the looked-up rows are of storage
// type T; the table's gradient is fp32 and summed in double.
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

template <class T>
__global__ void embedding_fwd_kernel(const T* table, const std::int32_t* ids, T* out, i64 N, i64 C,
                                     i64 V, i64 vocab_offset) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < N * C; i += (i64)gridDim.x * blockDim.x) {
    const i64 n = i / C, j = i % C;
    const i64 v = static_cast<i64>(ids[n]) - vocab_offset;
    out[i] = (v >= 0 && v < V) ? table[v * C + j] : from_float<T>(0.f);
  }
}

constexpr int kTile = kThreads;

template <class T>
__global__ void embedding_bwd_kernel(const T* dout, const std::int32_t* ids, float* dtable,
                                     i64 N, i64 C, i64 V, i64 vocab_offset) {
  __shared__ std::int32_t tile[kTile];
  for (i64 v = blockIdx.x; v < V; v += gridDim.x) {
    const std::int32_t id = static_cast<std::int32_t>(v + vocab_offset);
    float* row = dtable + v * C;
    // Channels in passes of blockDim; each pass rescans the ids.
    for (i64 j0 = 0; j0 < C; j0 += blockDim.x) {
      const i64 j = j0 + threadIdx.x;
      double acc = 0.0;
      bool touched = false;
      for (i64 t0 = 0; t0 < N; t0 += kTile) {
        const i64 n = t0 + threadIdx.x;
        const bool hit = n < N && ids[n] == id;
        __syncthreads();  // the previous tile is no longer read
        tile[threadIdx.x] = n < N ? ids[n] : id - 1;
        if (!__syncthreads_or(hit)) continue;
        touched = true;
        const i64 len = N - t0 < kTile ? N - t0 : kTile;
        if (j < C)
          for (i64 k = 0; k < len; ++k)
            if (tile[k] == id) acc += static_cast<double>(to_float(dout[(t0 + k) * C + j]));
      }
      if (touched && j < C) row[j] = static_cast<float>(static_cast<double>(row[j]) + acc);
    }
  }
}

}  // namespace

cudaError_t embedding_forward(const void* table, const std::int32_t* ids, void* out, int dtype,
                              i64 N, i64 C, i64 V, i64 vocab_offset, cudaStream_t s) {
  if (N * C <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    embedding_fwd_kernel<<<grid_for(N * C), kThreads, 0, s>>>(typed(tag, table), ids,
                                                              typed(tag, out), N, C, V, vocab_offset);
    return cudaGetLastError();
  });
}

cudaError_t embedding_backward(const void* dout, int dtype, const std::int32_t* ids, float* dtable,
                               i64 N, i64 C, i64 V, i64 vocab_offset, cudaStream_t s) {
  if (N <= 0 || V <= 0 || C <= 0) return cudaGetLastError();
  const unsigned blocks = static_cast<unsigned>(V < 65535 * 8 ? V : 65535 * 8);
  return with_storage(dtype, [&](auto tag) {
    embedding_bwd_kernel<<<blocks, kTile, 0, s>>>(typed(tag, dout), ids, dtable, N, C, V,
                                                  vocab_offset);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
