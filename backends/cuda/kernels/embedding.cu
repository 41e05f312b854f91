// Row gathers (gather_rows and the embedding lookup, which is a gather by
// token id) and the embedding's deterministic gradient. Backward stable-sorts
// the (row, position) pairs of the tokens (cub radix sort over the bits of
// the row index), then one block per run of equal rows adds the run's
// gradients in token order, in double, onto the fp32 row: no atomics, one
// write per touched row, O(N log V) sort plus O(N C) sums. The table and the
// looked-up rows are of storage type T.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>

#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {
namespace {

// Vectors a gather block copies per pass: whole rows, at least one.
constexpr int kGatherVectors = 1024;

// A row is `width` vectors V (16, 8, 4 or 2 bytes, as the row size and both
// pointers' alignment allow). One block per group of `rows` consecutive rows:
// thread k of a pass copies vector k % width of row k / width, so a warp
// reads consecutive vectors of one source row (or of a few) and writes
// consecutive vectors of out.
template <class V>
__global__ void gather_rows_kernel(const V* src, const std::int32_t* index, V* out, i64 N,
                                   int width, int rows, i64 M, i64 offset) {
  const int group = rows * width;
  for (i64 first = blockIdx.x * static_cast<i64>(rows); first < N;
       first += static_cast<i64>(gridDim.x) * rows) {
    for (int k = threadIdx.x; k < group; k += blockDim.x) {
      const int r = k / width, c = k - r * width;
      const i64 n = first + r;
      if (n >= N) break;  // later k are later rows
      const i64 row = static_cast<i64>(index[n]) - offset;
      V v{};  // zero bytes: a zero row of any float dtype
      if (row >= 0 && row < M) v = src[row * width + c];
      out[n * width + c] = v;
    }
  }
}

template <class V>
cudaError_t launch_gather(const void* src, const std::int32_t* index, void* out, i64 N,
                          i64 row_bytes, i64 M, i64 offset, cudaStream_t s) {
  const i64 width = row_bytes / static_cast<i64>(sizeof(V));
  if (width > INT_MAX / 2) return cudaErrorInvalidValue;
  const i64 rows = width >= kGatherVectors ? 1 : kGatherVectors / width;
  const i64 groups = (N + rows - 1) / rows;
  const unsigned grid = static_cast<unsigned>(groups < 65535 * 16 ? groups : 65535 * 16);
  gather_rows_kernel<V><<<grid, kThreads, 0, s>>>(static_cast<const V*>(src), index,
                                                  static_cast<V*>(out), N, static_cast<int>(width),
                                                  static_cast<int>(rows), M, offset);
  return cudaGetLastError();
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

cudaError_t gather_rows(const void* src, const std::int32_t* index, void* out, int dtype, i64 N,
                        i64 X, i64 M, i64 offset, cudaStream_t s) {
  if (N <= 0 || X <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    const i64 row_bytes = X * static_cast<i64>(sizeof(typename decltype(tag)::type));
    const auto fits = [&](i64 w) {
      return row_bytes % w == 0 && reinterpret_cast<std::uintptr_t>(src) % w == 0 &&
             reinterpret_cast<std::uintptr_t>(out) % w == 0;
    };
    if (fits(16)) return launch_gather<uint4>(src, index, out, N, row_bytes, M, offset, s);
    if (fits(8)) return launch_gather<uint2>(src, index, out, N, row_bytes, M, offset, s);
    if (fits(4)) return launch_gather<unsigned>(src, index, out, N, row_bytes, M, offset, s);
    return launch_gather<unsigned short>(src, index, out, N, row_bytes, M, offset, s);
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
