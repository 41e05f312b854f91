// Embedding lookup and its deterministic gradient. Backward stable-sorts the
// (row, position) pairs of the tokens (cub radix sort over the bits of the
// row index), then one block per run of equal rows adds the run's gradients
// in token order, in double, onto the fp32 row: no atomics, one write per
// touched row, O(N log V) sort plus O(N C) sums. The table and the looked-up
// rows are of storage type T.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>

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

// Sort keys: the row within the shard, or V for a token outside it (sorted
// last and skipped); values: token positions.
__global__ void embedding_keys_kernel(const std::int32_t* ids, std::uint32_t* keys,
                                      std::int32_t* positions, i64 N, i64 V, i64 vocab_offset) {
  for (i64 n = blockIdx.x * (i64)blockDim.x + threadIdx.x; n < N; n += (i64)gridDim.x * blockDim.x) {
    const i64 v = static_cast<i64>(ids[n]) - vocab_offset;
    keys[n] = static_cast<std::uint32_t>(v >= 0 && v < V ? v : V);
    positions[n] = static_cast<std::int32_t>(n);
  }
}

// One block per run of equal keys, at the run's first element: the row sums
// its tokens in position order (the sort is stable) in double, starting from
// the row's value, as the cpu backend does.
template <class T>
__global__ void embedding_runs_kernel(const T* dout, const std::uint32_t* keys,
                                      const std::int32_t* positions, float* dtable, i64 N, i64 C,
                                      i64 V) {
  __shared__ long long run_end;
  for (i64 i = blockIdx.x; i < N; i += gridDim.x) {
    const std::uint32_t v = keys[i];
    if (v >= V || (i > 0 && keys[i - 1] == v)) continue;  // uniform over the block
    // The run's end, blockDim keys at a time (a frequent token has thousands).
    i64 end = N;
    for (i64 k0 = i + 1; k0 < N; k0 += blockDim.x) {
      __syncthreads();  // run_end of the previous step is read
      if (threadIdx.x == 0) run_end = N;
      __syncthreads();
      const i64 k = k0 + threadIdx.x;
      if (k < N && keys[k] != v) atomicMin(&run_end, static_cast<long long>(k));  // order-free
      __syncthreads();
      if (run_end < N) {
        end = run_end;
        break;
      }
    }
    float* row = dtable + static_cast<i64>(v) * C;
    for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
      double acc = static_cast<double>(row[j]);
      for (i64 k = i; k < end; ++k) acc += static_cast<double>(to_float(dout[positions[k] * C + j]));
      row[j] = static_cast<float>(acc);
    }
  }
}

int key_bits(i64 V) {  // enough bits for keys 0..V
  int bits = 1;
  while (bits < 32 && (i64{1} << bits) <= V) ++bits;
  return bits;
}

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The scratch carve-up: cub's temporary storage, then keys and positions in
// and out of the sort.
struct SortScratch {
  std::size_t cub_bytes = 0, array_bytes = 0;
  std::size_t total() const { return aligned(cub_bytes) + 4 * array_bytes; }
};

cudaError_t sort_scratch(i64 N, i64 V, SortScratch& out) {
  out.array_bytes = aligned(sizeof(std::uint32_t) * static_cast<std::size_t>(N));
  return cub::DeviceRadixSort::SortPairs(nullptr, out.cub_bytes, static_cast<const std::uint32_t*>(nullptr),
                                         static_cast<std::uint32_t*>(nullptr),
                                         static_cast<const std::int32_t*>(nullptr),
                                         static_cast<std::int32_t*>(nullptr), static_cast<int>(N), 0,
                                         key_bits(V));
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

std::size_t embedding_backward_scratch(i64 N, i64 V) {
  SortScratch sc;
  if (N <= 0 || V <= 0 || N > INT32_MAX || sort_scratch(N, V, sc) != cudaSuccess) return kAlign;
  return sc.total();
}

cudaError_t embedding_backward(const void* dout, int dtype, const std::int32_t* ids, float* dtable,
                               i64 N, i64 C, i64 V, i64 vocab_offset, void* scratch,
                               std::size_t scratch_bytes, cudaStream_t s) {
  if (N <= 0 || V <= 0 || C <= 0) return cudaGetLastError();
  // cub counts items in int; keys hold rows 0..V.
  if (N > INT32_MAX || V >= INT32_MAX) return cudaErrorInvalidValue;
  SortScratch sc;
  cudaError_t e = sort_scratch(N, V, sc);
  if (e != cudaSuccess) return e;
  if (scratch_bytes < sc.total()) return cudaErrorInvalidValue;
  auto* base = static_cast<unsigned char*>(scratch);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base + aligned(sc.cub_bytes));
  auto* keys = reinterpret_cast<std::uint32_t*>(base + aligned(sc.cub_bytes) + sc.array_bytes);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + aligned(sc.cub_bytes) + 2 * sc.array_bytes);
  auto* pos = reinterpret_cast<std::int32_t*>(base + aligned(sc.cub_bytes) + 3 * sc.array_bytes);
  embedding_keys_kernel<<<grid_for(N), kThreads, 0, s>>>(ids, keys_in, pos_in, N, V, vocab_offset);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = cub::DeviceRadixSort::SortPairs(scratch, sc.cub_bytes, keys_in, keys, pos_in, pos,
                                      static_cast<int>(N), 0, key_bits(V), s);
  if (e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>(N < 65535 * 16 ? N : 65535 * 16);
  return with_storage(dtype, [&](auto tag) {
    embedding_runs_kernel<<<blocks, kThreads, 0, s>>>(typed(tag, dout), keys, pos, dtable, N, C, V);
    return cudaGetLastError();
  });
}

}  // namespace meshtrain::cuda::kernels
