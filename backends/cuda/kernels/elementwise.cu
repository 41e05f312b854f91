// Elementwise kernels, activations, dropout and the clip coefficient (sums
// and AdamW are multi_tensor.cu's): the same formulas as backends/cpu/kernels/,
// in fp32, over storage type T (float, bf16 or f16; see with_storage).
#include "backends/cuda/kernels/common.cuh"

namespace meshtrain::cuda::kernels {

#define MT_GRID_STRIDE(i, n) \
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

namespace {

__global__ void fill_kernel(void* x, int dtype, i64 n, float v) {
  MT_GRID_STRIDE(i, n) store_float(x, dtype, i, v);
}

__global__ void cast_kernel(const void* src, int sdt, void* dst, int ddt, i64 n) {
  MT_GRID_STRIDE(i, n) store_float(dst, ddt, i, load_as_float(src, sdt, i));
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, i64 n) {
  MT_GRID_STRIDE(i, n) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
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
__global__ void gelu_fwd_kernel(const T* x, T* out, i64 n) {
  MT_GRID_STRIDE(i, n) {
    const float v = to_float(x[i]);
    out[i] = from_float<T>(0.5f * v * (1.f + tanhf(kGeluK * (v + kGeluC * v * v * v))));
  }
}

template <class T>
__global__ void gelu_bwd_kernel(const T* dout, const T* x, T* dx, i64 n) {
  MT_GRID_STRIDE(i, n) {
    const float v = to_float(x[i]);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float dt = kGeluK * (1.f + 3.f * kGeluC * v * v) * (1.f - t * t);
    dx[i] = from_float<T>(to_float(dout[i]) * (0.5f * (1.f + t) + 0.5f * v * dt));
  }
}

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
  if (n > 0) cast_kernel<<<grid_for(n), kThreads, 0, s>>>(src, sdt, dst, ddt, n);
  return cudaGetLastError();
}
cudaError_t add(const void* a, const void* b, void* out, int dtype, i64 n, cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    add_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, a), typed(tag, b), typed(tag, out), n);
    return cudaGetLastError();
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
    gelu_fwd_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, x), typed(tag, out), n);
    return cudaGetLastError();
  });
}
cudaError_t gelu_backward(const void* dout, const void* x, void* dx, int dtype, i64 n,
                          cudaStream_t s) {
  if (n <= 0) return cudaGetLastError();
  return with_storage(dtype, [&](auto tag) {
    gelu_bwd_kernel<<<grid_for(n), kThreads, 0, s>>>(typed(tag, dout), typed(tag, x), typed(tag, dx), n);
    return cudaGetLastError();
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
