// Elementwise kernels, activations, dropout and the clip coefficient (sums
// and AdamW are multi_tensor.cu's): the same formulas as backends/cpu/kernels/,
// in fp32, over storage type T (float, bf16 or f16; see with_storage).
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {

#define MT_GRID_STRIDE(i, n) \
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

namespace {

// ---- 16-byte accesses ----------------------------------------------------------
// The per-step elementwise ops on bf16 (add, GELU and its backward, the master
// to working-copy cast) are bound by memory: a thread moves 16 bytes per load
// and store (8 bf16 or 4 fp32 elements) where every pointer is aligned to
// that, and one element at a time otherwise and for the tail. Each element's
// math is the same functor on either path, so the path never changes a bit.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
inline bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// out[i] = f(x[i]).
template <int V, class S, class D, class F>
__global__ void map1_kernel(const S* x, D* out, i64 n, bool packed, F f) {
  i64 done = 0;
  if (packed) {
    const i64 np = n / V;
    MT_GRID_STRIDE(i, np) {
      const Pack<S, V> a = reinterpret_cast<const Pack<S, V>*>(x)[i];
      Pack<D, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = f(a.v[k]);
      reinterpret_cast<Pack<D, V>*>(out)[i] = o;
    }
    done = np * V;
  }
  MT_GRID_STRIDE(i, n - done) out[done + i] = f(x[done + i]);
}

// out[i] = f(x[i], y[i]); out may be x or y (each element is read before it is written).
template <int V, class T, class F>
__global__ void map2_kernel(const T* x, const T* y, T* out, i64 n, bool packed, F f) {
  i64 done = 0;
  if (packed) {
    const i64 np = n / V;
    MT_GRID_STRIDE(i, np) {
      const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x)[i];
      const Pack<T, V> b = reinterpret_cast<const Pack<T, V>*>(y)[i];
      Pack<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = f(a.v[k], b.v[k]);
      reinterpret_cast<Pack<T, V>*>(out)[i] = o;
    }
    done = np * V;
  }
  MT_GRID_STRIDE(i, n - done) out[done + i] = f(x[done + i], y[done + i]);
}

template <class S, class D, class F>
cudaError_t map1(const S* x, D* out, i64 n, F f, cudaStream_t s) {
  constexpr int V = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  const bool packed = aligned(x, sizeof(S) * V) && aligned(out, sizeof(D) * V);
  map1_kernel<V><<<grid_for(packed ? n / V : n), kThreads, 0, s>>>(x, out, n, packed, f);
  return cudaGetLastError();
}
template <class T, class F>
cudaError_t map2(const T* x, const T* y, T* out, i64 n, F f, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const bool packed = aligned(x, 16) && aligned(y, 16) && aligned(out, 16);
  map2_kernel<V><<<grid_for(packed ? n / V : n), kThreads, 0, s>>>(x, y, out, n, packed, f);
  return cudaGetLastError();
}

template <class S, class D>
struct CastOp {
  __device__ D operator()(S x) const { return from_float<D>(to_float(x)); }
};
template <class T>
struct AddOp {
  __device__ T operator()(T a, T b) const { return from_float<T>(to_float(a) + to_float(b)); }
};

__global__ void fill_kernel(void* x, int dtype, i64 n, float v) {
  MT_GRID_STRIDE(i, n) store_float(x, dtype, i, v);
}

__global__ void cast_kernel(const void* src, int sdt, void* dst, int ddt, i64 n) {
  MT_GRID_STRIDE(i, n) store_float(dst, ddt, i, load_as_float(src, sdt, i));
}

template <class T>
__global__ void scale_kernel(T* x, i64 n, float alpha) {
  MT_GRID_STRIDE(i, n) x[i] = from_float<T>(to_float(x[i]) * alpha);
}

template <class T>
__global__ void axpy_kernel(float alpha, const T* x, T* y, i64 n) {
  MT_GRID_STRIDE(i, n) y[i] = from_float<T>(to_float(y[i]) + alpha * to_float(x[i]));
}

__global__ void gemm_k0_kernel(float* c, const float* bias, i64 m, i64 n, float beta) {
  MT_GRID_STRIDE(i, m * n) {
    const float old = beta == 0.f ? 0.f : beta * c[i];
    c[i] = bias ? old + bias[i % n] : old;
  }
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

template <class T>
struct GeluForward {
  __device__ T operator()(T x) const {
    const float v = to_float(x);
    return from_float<T>(0.5f * v * (1.f + tanhf(kGeluK * (v + kGeluC * v * v * v))));
  }
};

template <class T>
struct GeluBackward {  // (dout, x) -> dx
  __device__ T operator()(T dout, T x) const {
    const float v = to_float(x);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float dt = kGeluK * (1.f + 3.f * kGeluC * v * v) * (1.f - t * t);
    return from_float<T>(to_float(dout) * (0.5f * (1.f + t) + 0.5f * v * dt));
  }
};

template <class T>
__global__ void swiglu_fwd_kernel(const T* x, T* out, i64 N, i64 F) {
  MT_GRID_STRIDE(i, N * F) {
    const i64 r = i / F, j = i % F;
    const float g = to_float(x[r * 2 * F + j]), u = to_float(x[r * 2 * F + F + j]);
    out[i] = from_float<T>(g / (1.f + expf(-g)) * u);
  }
}

template <class T>
__global__ void swiglu_bwd_kernel(const T* dout, const T* x, T* dx, i64 N, i64 F) {
  MT_GRID_STRIDE(i, N * F) {
    const i64 r = i / F, j = i % F;
    const float g = to_float(x[r * 2 * F + j]), u = to_float(x[r * 2 * F + F + j]);
    const float d = to_float(dout[i]);
    const float s = 1.f / (1.f + expf(-g));
    dx[r * 2 * F + F + j] = from_float<T>(d * g * s);
    dx[r * 2 * F + j] = from_float<T>(d * u * s * (1.f + g * (1.f - s)));
  }
}

// splitmix64's finaliser, as backends/cpu/kernels/activation.h.
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class T>
__global__ void dropout_kernel(const T* x, T* out, i64 n, float p, std::uint64_t seed,
                               std::uint64_t offset, float s) {
  const std::uint64_t base = mix64(seed ^ 0x9e3779b97f4a7c15ull);
  MT_GRID_STRIDE(i, n) {
    const std::uint64_t h = mix64(base + offset + static_cast<std::uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * 0x1p-24f;
    out[i] = from_float<T>(u >= p ? to_float(x[i]) * s : 0.f);
  }
}

__global__ void clip_kernel(const float* sumsq, float max_norm, float* coef) {
  const float c = max_norm / (sqrtf(*sumsq) + 1e-6f);
  *coef = c < 1.f ? c : 1.f;
}

}  // namespace

cudaError_t fill(void* x, int dtype, i64 n, float value, cudaStream_t s) {
  if (n > 0) fill_kernel<<<grid_for(n), kThreads, 0, s>>>(x, dtype, n, value);
  return cudaGetLastError();
}
cudaError_t cast(const void* src, int sdt, void* dst, int ddt, i64 n, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  if (sdt > 2 || ddt > 2) {  // int32 on either side: one element at a time
    cast_kernel<<<grid_for(n), kThreads, 0, s>>>(src, sdt, dst, ddt, n);
    return cudaGetLastError();
  }
  return with_storage(sdt, [&](auto from) {
    return with_storage(ddt, [&](auto to) {
      using S = typename decltype(from)::type;
      using D = typename decltype(to)::type;
      return map1(typed(from, src), typed(to, dst), n, CastOp<S, D>{}, s);
    });
  });
}
cudaError_t add(const void* a, const void* b, void* out, int dtype, i64 n, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return map2(typed(tag, a), typed(tag, b), typed(tag, out), n, AddOp<T>{}, s);
  });
}
cudaError_t scale(void* x, int dtype, i64 n, float alpha, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    scale_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, x), n, alpha);
    return cudaGetLastError();
  });
}
cudaError_t axpy(float alpha, const void* x, void* y, int dtype, i64 n, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(alpha, typed(tag, x), typed(tag, y), n);
    return cudaGetLastError();
  });
}
cudaError_t gemm_k0(float* c, const float* bias, i64 m, i64 n, float beta, cudaStream_t s) {
  if (m * n > 0) gemm_k0_kernel<<<grid_for(m * n), kThreads, 0, s>>>(c, bias, m, n, beta);
  return cudaGetLastError();
}
cudaError_t gelu_forward(const void* x, void* out, int dtype, i64 n, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return map1(typed(tag, x), typed(tag, out), n, GeluForward<T>{}, s);
  });
}
cudaError_t gelu_backward(const void* dout, const void* x, void* dx, int dtype, i64 n,
                          cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return map2(typed(tag, dout), typed(tag, x), typed(tag, dx), n, GeluBackward<T>{}, s);
  });
}
cudaError_t swiglu_forward(const void* x, void* out, int dtype, i64 N, i64 F, cudaStream_t s) {
  if (N * F <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    swiglu_fwd_kernel<<<grid_for(N * F), kThreads, 0, s>>>(typed(tag, x), typed(tag, out), N, F);
    return cudaGetLastError();
  });
}
cudaError_t swiglu_backward(const void* dout, const void* x, void* dx, int dtype, i64 N, i64 F,
                            cudaStream_t s) {
  if (N * F <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    swiglu_bwd_kernel<<<grid_for(N * F), kThreads, 0, s>>>(typed(tag, dout), typed(tag, x), typed(tag, dx), N, F);
    return cudaGetLastError();
  });
}
cudaError_t dropout(const void* x, void* out, int dtype, i64 n, float p, std::uint64_t seed,
                    std::uint64_t offset, cudaStream_t s) {
  const float sc = p < 1.0f ? 1.f / (1.f - p) : 0.f;
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    dropout_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, x), typed(tag, out), n, p, seed, offset, sc);
    return cudaGetLastError();
  });
}
cudaError_t clip_coefficient(const float* sumsq, float max_norm, float* coef, cudaStream_t s) {
  clip_kernel<<<1, 1, 0, s>>>(sumsq, max_norm, coef);
  return cudaGetLastError();
}
}  // namespace meshtrain::cuda::kernels
