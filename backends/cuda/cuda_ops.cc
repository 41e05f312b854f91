// CudaBackend compute ops: shape checks (op_checks.h), then a cuBLASLt call
// or one of the kernels of kernels/. Legend as backends/backend.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/host_adamw.h"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/misuse.h"
#include "backends/cuda/op_checks.h"
#include "backends/normal_init_check.h"

namespace meshtrain::cuda {

#define MT_STREAM static_cast<cudaStream_t>(stream_handle())

namespace {
// Aborts on a failed check (misuse), else gives the value.
template <class T>
T must(Result<T> r, std::string_view op) {
  if (!r.ok()) misuse("{}: {}", op, r.error().message());
  return std::move(r).value();
}
void must(Status s, std::string_view op) {
  if (!s.ok()) misuse("{}: {}", op, s.error().message());
}
// The shared storage dtype of an op's activation-like tensors, as a kernel dtype code.
int storage(std::initializer_list<Named> tensors, std::string_view op) {
  return kernel_dtype(must(storage_dtype(tensors), op));
}
// Bias corrections in double on the host, rounded once, as the cpu backend.
// A frozen variance (AdamWOp::variance_frozen_at) is v = 1·v + 0·g², corrected as at its step.
kernels::AdamWArgs adamw_args(const AdamWOp& op, float weight_decay) {
  const double t = static_cast<double>(op.step);
  const double t2 = static_cast<double>(op.variance_frozen_at > 0 ? op.variance_frozen_at : op.step);
  return kernels::AdamWArgs{
      op.lr,
      op.beta1,
      op.variance_frozen_at > 0 ? 1.f : op.beta2,
      op.eps,
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(op.beta1), t))),
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(op.beta2), t2))),
      static_cast<float>(1.0 - static_cast<double>(op.lr) * static_cast<double>(weight_decay))};
}
std::int64_t cols_of(const Tensor& t, std::string_view op) {
  if (t.shape().rank() == 0) misuse("{}: tensor without dimensions", op);
  return t.shape().back();
}
}  // namespace

// ---- dense ---------------------------------------------------------------------------

void CudaBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  const GemmDims d = must(gemm_dims(a, b, c, op), "gemm");
  GemmCall call{op.trans_a, op.trans_b, 1, d.m, d.n, d.k, op.alpha, op.beta,
                ptr(a, "gemm"), ptr(b, "gemm"), ptr(c, "gemm"),
                op.bias.defined() ? ptr(op.bias, "gemm bias") : nullptr, a.dtype(), c.dtype(),
                current_.id};
  if (failed() || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {
    if (c.dtype() != DType::f32) misuse("gemm: k = 0 needs an f32 output");
    check(kernels::gemm_k0(static_cast<float*>(call.c), static_cast<const float*>(call.bias), d.m,
                           d.n, op.beta, MT_STREAM),
          "gemm");
    return;
  }
  Status s = gemm_->run(call, MT_STREAM);
  if (!s.ok()) fail(std::move(s).error().context(fmt::format("cuda rank {}: gemm", rank_)));
}

Result<std::function<void()>> CudaBackend::fp8_gemm_call(std::int64_t m, std::int64_t n, std::int64_t k,
                                                          bool split_accumulator, Tensor* c) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device()) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device()) != cudaSuccess)
    return make_error("FP8 GEMM: cannot read device {}'s compute capability", device());
  if (major * 10 + minor < 89)
    return make_error("FP8 GEMM: device {} (compute capability {}.{}) has no FP8 tensor cores; they start at 8.9 "
                      "(Ada, Hopper)",
                      device(), major, minor);
  if (m <= 0 || n <= 0 || k <= 0) return make_error("FP8 GEMM: {}x{}x{} is empty", m, n, k);
  if (c != nullptr && (c->dtype() != DType::bf16 || c->numel() != m * n))
    return make_error("FP8 GEMM: c must be ({}, {}) bf16, got {} {}", m, n, c->shape().str(), dtype_name(c->dtype()));
  // a (m, k) and b (n, k) of E4M3 ones (0x38), unit scales, c (m, n) bf16 unless given: held by the call.
  const auto bytes = [](std::int64_t x, std::int64_t y, std::int64_t each) { return static_cast<std::size_t>(x * y * each); };
  std::vector<CachingAllocator::Allocation> held = {scratch(bytes(m, k, 1), "fp8 gemm"), scratch(bytes(n, k, 1), "fp8 gemm"),
                                                    scratch(2 * sizeof(float), "fp8 gemm")};
  if (c == nullptr) held.push_back(scratch(bytes(m, n, 2), "fp8 gemm"));
  auto buffers = std::shared_ptr<std::vector<CachingAllocator::Allocation>>(
      new std::vector<CachingAllocator::Allocation>(std::move(held)), [this](auto* v) {
        for (const auto& a : *v) release(a);
        delete v;
      });
  const auto& buf = *buffers;
  const float ones[2] = {1.f, 1.f};
  check(cudaMemsetAsync(buf[0].ptr, 0x38, bytes(m, k, 1), MT_STREAM), "fp8 gemm");
  check(cudaMemsetAsync(buf[1].ptr, 0x38, bytes(n, k, 1), MT_STREAM), "fp8 gemm");
  check(cudaMemcpyAsync(buf[2].ptr, ones, sizeof ones, cudaMemcpyHostToDevice, MT_STREAM), "fp8 gemm");
  check(cudaStreamSynchronize(MT_STREAM), "fp8 gemm");  // `ones` leaves with this frame
  MT_TRY(sticky());
  void* out = c != nullptr ? ptr(*c, "fp8 gemm") : buf[3].ptr;
  GemmCall call{false, true, 1, m, n, k, 1.f, 0.f, buf[0].ptr, buf[1].ptr, out, nullptr, DType::bf16,
                DType::bf16, current_.id};
  call.fp8 = {true, Fp8Format::e4m3, Fp8Format::e4m3, static_cast<const float*>(buf[2].ptr),
              static_cast<const float*>(buf[2].ptr) + 1, split_accumulator};
  // One run first, its error returned rather than made sticky: a shape cuBLASLt has no FP8 kernel for is
  // the caller's to note, and the backend stays usable. The calls then run on the stream the buffers
  // were allocated on, so that the allocator cannot hand them out while a GEMM still reads them.
  const auto stream = MT_STREAM;
  MT_TRY(gemm_->run(call, stream));
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return make_error("FP8 GEMM {}x{}x{}: {}", m, n, k, cudaGetErrorString(e));
  return std::function<void()>([this, call, buffers, stream]() {
    if (failed()) return;
    Status s = gemm_->run(call, stream);
    if (!s.ok()) fail(std::move(s).error().context(fmt::format("cuda rank {}: fp8 gemm", rank_)));
  });
}

void CudaBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  const GemmDims d = must(batched_gemm_dims(a, b, c, op), "batched_gemm");
  GemmCall call{op.trans_a, op.trans_b, d.batch, d.m, d.n, d.k, op.alpha, op.beta,
                ptr(a, "batched_gemm"), ptr(b, "batched_gemm"), ptr(c, "batched_gemm"),
                op.bias.defined() ? ptr(op.bias, "batched_gemm bias") : nullptr, a.dtype(),
                c.dtype(), current_.id};
  if (failed() || d.batch == 0 || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {
    if (c.dtype() != DType::f32) misuse("batched_gemm: k = 0 needs an f32 output");
    for (std::int64_t l = 0; l < d.batch; ++l)
      check(kernels::gemm_k0(static_cast<float*>(call.c) + l * d.m * d.n,
                             static_cast<const float*>(call.bias), d.m, d.n, op.beta, MT_STREAM),
            "batched_gemm");
    return;
  }
  Status s = gemm_->run(call, MT_STREAM);
  if (!s.ok()) fail(std::move(s).error().context(fmt::format("cuda rank {}: batched_gemm", rank_)));
}

void CudaBackend::bias_backward(const Tensor& dy, Tensor& db) {
  const int dt = storage({{"dy", &dy}}, "bias_backward");
  const void* pdy = ptr(dy, "bias_backward");
  float* pdb = f32(db, "bias_backward");
  const std::int64_t n = db.numel(), m = must(rows_of(dy, n), "bias_backward");
  if (failed()) return;
  const auto tmp = scratch(sizeof(double) * static_cast<std::size_t>(kernels::row_chunks(m) * n), "bias_backward");
  check(kernels::bias_backward(pdy, dt, pdb, m, n, static_cast<double*>(tmp.ptr), MT_STREAM), "bias_backward");
  release(tmp);
}

// ---- embedding ---------------------------------------------------------------------

void CudaBackend::embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                    std::int64_t vocab_offset) {
  constexpr std::string_view op = "embedding_forward";
  const int dt = storage({{"table", &table}, {"out", &out}}, op);
  const void* pt = ptr(table, op);
  const std::int32_t* pi = i32(ids, op);
  void* po = ptr(out, op);
  const std::int64_t C = cols_of(table, op), V = table.numel() / std::max<std::int64_t>(C, 1);
  must(expect_numel(out, ids.numel() * C, "out"), op);
  if (failed()) return;
  check(kernels::gather_rows(pt, pi, po, dt, ids.numel(), C, V, vocab_offset, MT_STREAM), op);
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                     std::int64_t vocab_offset) {
  constexpr std::string_view op = "embedding_backward";
  const int dt = storage({{"dout", &dout}}, op);
  const void* pd = ptr(dout, op);
  const std::int32_t* pi = i32(ids, op);
  float* pt = f32(dtable, op);
  const std::int64_t C = cols_of(dtable, op), V = dtable.numel() / std::max<std::int64_t>(C, 1);
  must(expect_numel(dout, ids.numel() * C, "dout"), op);
  if (failed()) return;
  const std::int64_t N = ids.numel();
  const auto tmp = scratch(kernels::embedding_backward_scratch(N, V), op);
  check(kernels::embedding_backward(pd, dt, pi, pt, N, C, V, vocab_offset, tmp.ptr, tmp.size, MT_STREAM), op);
  release(tmp);
}

// ---- index maps ------------------------------------------------------------------------

void CudaBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  constexpr std::string_view op = "gather_rows";
  const int dt = storage({{"src", &src}, {"out", &out}}, op);
  const void* ps = ptr(src, op);
  const std::int32_t* pi = i32(index, op);
  void* po = ptr(out, op);
  const std::int64_t X = cols_of(src, op), M = X == 0 ? 0 : src.numel() / X;
  must(expect_numel(out, index.numel() * X, "out"), op);
  if (failed()) return;
  check(kernels::gather_rows(ps, pi, po, dt, index.numel(), X, M, 0, MT_STREAM), op);
}

// ---- mixture of experts ----------------------------------------------------------------

void CudaBackend::moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                            Tensor& experts) {
  constexpr std::string_view op = "moe_route";
  const RoutingDims d = must(routing_dims(logits, experts), op);
  must(expect_numel(probs, d.N * d.E, "probs"), op);
  must(expect_numel(lse, d.N, "lse"), op);
  must(expect_numel(weights, d.N * d.K, "weights"), op);
  const float* pl = f32(logits, op);
  float *pp = f32(probs, op), *plse = f32(lse, op), *pw = f32(weights, op);
  auto* pe = const_cast<std::int32_t*>(i32(experts, op));
  if (failed()) return;
  check(kernels::moe_route(pl, pp, plse, pw, pe, d.N, d.E, d.K, renormalize, MT_STREAM), op);
}

void CudaBackend::moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                                     const Tensor& experts, const Tensor& prob_grad, float z_scale, bool renormalize,
                                     Tensor& dlogits) {
  constexpr std::string_view op = "moe_route_backward";
  const RoutingDims d = must(routing_dims(probs, experts), op);
  must(expect_numel(dweights, d.N * d.K, "dweights"), op);
  must(expect_numel(lse, d.N, "lse"), op);
  must(expect_numel(prob_grad, d.E, "prob_grad"), op);
  must(expect_numel(dlogits, d.N * d.E, "dlogits"), op);
  const float *pdw = f32(dweights, op), *pp = f32(probs, op), *plse = f32(lse, op), *pg = f32(prob_grad, op);
  const std::int32_t* pe = i32(experts, op);
  float* pd = f32(dlogits, op);
  if (failed()) return;
  check(kernels::moe_route_backward(pdw, pp, plse, pe, pg, z_scale, renormalize, pd, d.N, d.E, d.K, MT_STREAM), op);
}

void CudaBackend::moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) {
  constexpr std::string_view op = "moe_combine";
  const int dt = storage({{"rows", &rows}, {"out", &out}}, op);
  const std::int64_t C = cols_of(rows, op), K = cols_of(index, op), N = K == 0 ? 0 : index.numel() / K;
  must(expect_numel(weights, index.numel(), "weights"), op);
  must(expect_numel(out, N * C, "out"), op);
  const void* pr = ptr(rows, op);
  const std::int32_t* pi = i32(index, op);
  const float* pw = f32(weights, op);
  void* po = ptr(out, op);
  if (failed()) return;
  check(kernels::moe_combine(pr, pi, pw, po, dt, N, K, C, MT_STREAM), op);
}

void CudaBackend::moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index,
                                       const Tensor& weights, Tensor& drows, Tensor& dweights) {
  constexpr std::string_view op = "moe_combine_backward";
  const int dt = storage({{"dout", &dout}, {"rows", &rows}, {"drows", &drows}}, op);
  const std::int64_t C = cols_of(rows, op), K = cols_of(index, op), N = K == 0 ? 0 : index.numel() / K;
  const std::int64_t M = C == 0 ? 0 : rows.numel() / C;
  must(expect_numel(weights, index.numel(), "weights"), op);
  must(expect_numel(dweights, index.numel(), "dweights"), op);
  must(expect_numel(dout, N * C, "dout"), op);
  must(expect_numel(drows, rows.numel(), "drows"), op);
  const void *pd = ptr(dout, op), *pr = ptr(rows, op);
  const std::int32_t* pi = i32(index, op);
  const float* pw = f32(weights, op);
  void* pdr = ptr(drows, op);
  float* pdw = f32(dweights, op);
  if (failed()) return;
  check(kernels::moe_combine_backward(pd, pr, pi, pw, pdr, pdw, dt, N, K, C, M, MT_STREAM), op);
}

// ---- 1-bit gradient compression ------------------------------------------------------

namespace {
// The chunks (C) and chunk size (k) of values (C, k), checked against packets (C, 1 + ceil(k/32)).
std::pair<std::int64_t, std::int64_t> sign_chunks(const Tensor& values, const Tensor& packets, std::string_view op) {
  const std::int64_t k = cols_of(values, op), C = k == 0 ? 0 : values.numel() / k;
  const std::int64_t W = (k + 31) / 32;
  if (packets.shape().rank() == 0 || packets.shape().back() != 1 + W || packets.numel() != C * (1 + W))
    misuse("{}: packets {} must be ({}, {}) for values {}", op, packets.shape().str(), C, 1 + W,
           values.shape().str());
  return {C, k};
}
}  // namespace

void CudaBackend::sign_compress(const Tensor& x, Tensor& error, Tensor& packets) {
  constexpr std::string_view op = "sign_compress";
  const auto [C, k] = sign_chunks(x, packets, op);
  if (error.defined()) must(expect_numel(error, x.numel(), "error"), op);
  const float* px = f32(x, op);
  float* pe = error.defined() ? f32(error, op) : nullptr;
  auto* pp = const_cast<std::int32_t*>(i32(packets, op));
  if (failed()) return;
  check(kernels::sign_compress(px, pe, pp, C, k, MT_STREAM), op);
}

void CudaBackend::sign_decompress(const Tensor& packets, Tensor& out) {
  constexpr std::string_view op = "sign_decompress";
  const auto [C, k] = sign_chunks(out, packets, op);
  const std::int32_t* pp = i32(packets, op);
  float* po = f32(out, op);
  if (failed()) return;
  check(kernels::sign_decompress(pp, po, C, k, MT_STREAM), op);
}

// ---- normalisation -------------------------------------------------------------------

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    Tensor& out, Tensor& mean, Tensor& rstd, float eps) {
  constexpr std::string_view op = "layernorm_forward";
  const std::int64_t C = weight.numel(), N = must(rows_of(x, C), op);
  must(expect_numel(bias, C, "bias"), op);
  must(expect_numel(out, N * C, "out"), op);
  must(expect_numel(mean, N, "mean"), op);
  must(expect_numel(rstd, N, "rstd"), op);
  const int dt = storage({{"x", &x}, {"weight", &weight}, {"bias", &bias}, {"out", &out}}, op);
  const void *px = ptr(x, op), *pw = ptr(weight, op), *pb = ptr(bias, op);
  void* po = ptr(out, op);
  float *pm = f32(mean, op), *pr = f32(rstd, op);
  if (failed()) return;
  check(kernels::layernorm_forward(px, pw, pb, po, dt, pm, pr, N, C, eps, MT_STREAM), op);
}

void CudaBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias) {
  constexpr std::string_view op = "layernorm_backward";
  const std::int64_t C = weight.numel(), N = must(rows_of(x, C), op);
  must(expect_numel(dout, N * C, "dout"), op);
  must(expect_numel(dx, N * C, "dx"), op);
  must(expect_numel(mean, N, "mean"), op);
  must(expect_numel(rstd, N, "rstd"), op);
  must(expect_numel(dweight, C, "dweight"), op);
  must(expect_numel(dbias, C, "dbias"), op);
  const int dt = storage({{"dout", &dout}, {"x", &x}, {"weight", &weight}, {"dx", &dx}}, op);
  const void *pd = ptr(dout, op), *px = ptr(x, op), *pw = ptr(weight, op);
  void* pdx = ptr(dx, op);
  const float *pm = f32(mean, op), *pr = f32(rstd, op);
  float *pdw = f32(dweight, op), *pdb = f32(dbias, op);
  if (failed()) return;
  const auto tmp = scratch(sizeof(double) * static_cast<std::size_t>(kernels::row_chunks(N) * 2 * C), op);
  check(kernels::layernorm_backward(pd, px, pw, pdx, dt, pm, pr, pdw, pdb, N, C,
                                    static_cast<double*>(tmp.ptr), MT_STREAM),
        op);
  release(tmp);
}

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                                  float eps) {
  constexpr std::string_view op = "rmsnorm_forward";
  const std::int64_t C = weight.numel(), N = must(rows_of(x, C), op);
  must(expect_numel(out, N * C, "out"), op);
  must(expect_numel(rstd, N, "rstd"), op);
  const int dt = storage({{"x", &x}, {"weight", &weight}, {"out", &out}}, op);
  const void *px = ptr(x, op), *pw = ptr(weight, op);
  void* po = ptr(out, op);
  float* pr = f32(rstd, op);
  if (failed()) return;
  check(kernels::rmsnorm_forward(px, pw, po, dt, pr, N, C, eps, MT_STREAM), op);
}

void CudaBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  constexpr std::string_view op = "rmsnorm_backward";
  const std::int64_t C = weight.numel(), N = must(rows_of(x, C), op);
  must(expect_numel(dout, N * C, "dout"), op);
  must(expect_numel(dx, N * C, "dx"), op);
  must(expect_numel(rstd, N, "rstd"), op);
  must(expect_numel(dweight, C, "dweight"), op);
  const int dt = storage({{"dout", &dout}, {"x", &x}, {"weight", &weight}, {"dx", &dx}}, op);
  const void *pd = ptr(dout, op), *px = ptr(x, op), *pw = ptr(weight, op);
  void* pdx = ptr(dx, op);
  const float* pr = f32(rstd, op);
  float* pdw = f32(dweight, op);
  if (failed()) return;
  const auto tmp = scratch(sizeof(double) * static_cast<std::size_t>(kernels::row_chunks(N) * C), op);
  check(kernels::rmsnorm_backward(pd, px, pw, pdx, dt, pr, pdw, N, C,
                                  static_cast<double*>(tmp.ptr), MT_STREAM),
        op);
  release(tmp);
}

// ---- activations -----------------------------------------------------------------------

void CudaBackend::gelu_forward(const Tensor& x, Tensor& out) {
  const int dt = storage({{"x", &x}, {"out", &out}}, "gelu_forward");
  const void* px = ptr(x, "gelu_forward");
  void* po = ptr(out, "gelu_forward");
  must(expect_numel(out, x.numel(), "out"), "gelu_forward");
  if (failed()) return;
  check(kernels::gelu_forward(px, po, dt, x.numel(), MT_STREAM), "gelu_forward");
}

void CudaBackend::gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  const int dt = storage({{"dout", &dout}, {"x", &x}, {"dx", &dx}}, "gelu_backward");
  const void *pd = ptr(dout, "gelu_backward"), *px = ptr(x, "gelu_backward");
  void* pdx = ptr(dx, "gelu_backward");
  must(expect_numel(dout, x.numel(), "dout"), "gelu_backward");
  must(expect_numel(dx, x.numel(), "dx"), "gelu_backward");
  if (failed()) return;
  check(kernels::gelu_backward(pd, px, pdx, dt, x.numel(), MT_STREAM), "gelu_backward");
}

void CudaBackend::swiglu_forward(const Tensor& x, Tensor& out) {
  const int dt = storage({{"x", &x}, {"out", &out}}, "swiglu_forward");
  const void* px = ptr(x, "swiglu_forward");
  void* po = ptr(out, "swiglu_forward");
  const std::int64_t W = cols_of(x, "swiglu_forward");
  if (W % 2 != 0) misuse("swiglu_forward: x {} must be (N, 2F)", x.shape().str());
  must(expect_numel(out, x.numel() / 2, "out"), "swiglu_forward");
  if (failed() || W == 0) return;
  check(kernels::swiglu_forward(px, po, dt, x.numel() / W, W / 2, MT_STREAM), "swiglu_forward");
}

void CudaBackend::swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  const int dt = storage({{"dout", &dout}, {"x", &x}, {"dx", &dx}}, "swiglu_backward");
  const void *pd = ptr(dout, "swiglu_backward"), *px = ptr(x, "swiglu_backward");
  void* pdx = ptr(dx, "swiglu_backward");
  const std::int64_t W = cols_of(x, "swiglu_backward");
  if (W % 2 != 0) misuse("swiglu_backward: x {} must be (N, 2F)", x.shape().str());
  must(expect_numel(dout, x.numel() / 2, "dout"), "swiglu_backward");
  must(expect_numel(dx, x.numel(), "dx"), "swiglu_backward");
  if (failed() || W == 0) return;
  check(kernels::swiglu_backward(pd, px, pdx, dt, x.numel() / W, W / 2, MT_STREAM), "swiglu_backward");
}

namespace {
void expect_probability(float p, std::string_view op) {
  if (!(p >= 0.f && p <= 1.f)) misuse("{}: p = {} is not a probability", op, p);
}
}  // namespace

void CudaBackend::dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) {
  const int dt = storage({{"x", &x}, {"out", &out}}, "dropout_forward");
  const void* px = ptr(x, "dropout_forward");
  void* po = ptr(out, "dropout_forward");
  must(expect_numel(out, x.numel(), "out"), "dropout_forward");
  expect_probability(op.p, "dropout_forward");
  if (failed()) return;
  check(kernels::dropout(px, po, dt, x.numel(), op.p, op.seed, op.offset, MT_STREAM), "dropout_forward");
}

void CudaBackend::dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) {
  const int dt = storage({{"dout", &dout}, {"dx", &dx}}, "dropout_backward");
  const void* pd = ptr(dout, "dropout_backward");
  void* pdx = ptr(dx, "dropout_backward");
  must(expect_numel(dx, dout.numel(), "dx"), "dropout_backward");
  expect_probability(op.p, "dropout_backward");
  if (failed()) return;
  check(kernels::dropout(pd, pdx, dt, dout.numel(), op.p, op.seed, op.offset, MT_STREAM),
        "dropout_backward");
}

// ---- attention -------------------------------------------------------------------------

void CudaBackend::rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
                       std::int64_t first_position) {
  const int dt = storage({{"x", &x}}, "rope");
  void* px = ptr(x, "rope");
  must(rope_check(x, heads_total, rotate_heads), "rope");
  if (failed()) return;
  const Shape& s = x.shape();
  const auto tmp = scratch(sizeof(float) * static_cast<std::size_t>(s[1] * s[3]), "rope");
  check(kernels::rope(px, dt, s[0], s[1], heads_total, rotate_heads, s[3], theta, inverse, first_position,
                      static_cast<float*>(tmp.ptr), MT_STREAM),
        "rope");
  release(tmp);
}

kernels::AttentionTerms CudaBackend::attention_terms(const AttentionOp& op, std::int64_t T,
                                                     std::int64_t H, std::int64_t windows,
                                                     std::string_view name,
                                                     CachingAllocator::Allocation& bias_scratch) {
  kernels::AttentionTerms terms;
  terms.causal = op.causal;
  terms.tuned_tc = tuned_attention_;
  if (op.mask.defined()) {
    terms.mask = f32(op.mask, name);
    terms.windows = windows;
  }
  if (op.bias.defined()) {
    const void* pb = ptr(op.bias, name);
    bias_scratch = scratch(sizeof(float) * static_cast<std::size_t>(T * T * H), name);
    auto* heads_first = static_cast<float*>(bias_scratch.ptr);
    terms.bias = heads_first;
    check(kernels::attention_bias_heads_first(pb, kernel_dtype(op.bias.dtype()), heads_first, T, H, MT_STREAM),
          name);
  }
  return terms;
}

void CudaBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                    const AttentionOp& op) {
  constexpr std::string_view name = "attention_forward";
  const AttentionDims d = must(attention_dims(qkv, op), name);
  const std::int64_t windows = must(score_terms_check(op, d, qkv.dtype(), false), name);
  must(expect_numel(out, d.B * d.rows() * d.H * d.D, "out"), name);
  must(expect_dtype(out, qkv.dtype(), "out"), name);
  must(expect_numel(lse, d.B * d.H * d.rows(), "lse"), name);
  const void* pq = ptr(qkv, name);
  void* po = ptr(out, name);
  float* pl = f32(lse, name);
  if (failed()) return;
  CachingAllocator::Allocation bias_tmp;
  const kernels::AttentionTerms terms = attention_terms(op, d.T, d.H, windows, name, bias_tmp);
  const kernels::AttentionShape shape{d.B, d.T, d.H, d.G, d.D, op.scale, d.q0, d.Q};
  check(kernels::attention_forward(pq, po, pl, shape, terms, static_cast<int>(qkv.dtype()), MT_STREAM),
        name);
  if (bias_tmp.block != nullptr) release(bias_tmp);
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, Tensor& dqkv, const AttentionOp& op) {
  constexpr std::string_view name = "attention_backward";
  const AttentionDims d = must(attention_dims(qkv, op), name);
  must(expect_numel(dout, d.B * d.rows() * d.H * d.D, "dout"), name);
  must(expect_numel(out, d.B * d.rows() * d.H * d.D, "out"), name);
  must(expect_numel(lse, d.B * d.H * d.rows(), "lse"), name);
  must(expect_numel(dqkv, qkv.numel(), "dqkv"), name);
  for (const Tensor* t : {&dout, &out, static_cast<const Tensor*>(&dqkv)}) must(expect_dtype(*t, qkv.dtype(), "tensor"), name);
  const std::int64_t windows = must(score_terms_check(op, d, qkv.dtype(), true), name);
  const void *pd = ptr(dout, name), *pq = ptr(qkv, name), *po = ptr(out, name);
  const float* pl = f32(lse, name);
  void* pdq = ptr(dqkv, name);
  float* pdb = op.bias.defined() ? f32(op.dbias, name) : nullptr;
  if (failed()) return;
  CachingAllocator::Allocation bias_tmp, ds_tmp;
  kernels::AttentionTerms terms = attention_terms(op, d.T, d.H, windows, name, bias_tmp);
  if (pdb != nullptr) {  // every dS of the batch, summed into dbias in batch order below
    ds_tmp = scratch(sizeof(float) * static_cast<std::size_t>(d.B * d.H * d.T * d.T), name);
    terms.dscores = static_cast<float*>(ds_tmp.ptr);
  }
  const auto tmp = scratch(sizeof(float) * static_cast<std::size_t>(d.B * d.H * d.rows()), name);
  const kernels::AttentionShape shape{d.B, d.T, d.H, d.G, d.D, op.scale, d.q0, d.Q};
  check(kernels::attention_backward(pd, pq, po, pl, pdq, shape, terms, static_cast<int>(qkv.dtype()),
                                    static_cast<float*>(tmp.ptr), MT_STREAM),
        name);
  release(tmp);
  if (pdb != nullptr) {
    check(kernels::attention_dbias(terms.dscores, pdb, d.B, d.H, d.T, op.causal, MT_STREAM), name);
    release(ds_tmp);
  }
  if (bias_tmp.block != nullptr) release(bias_tmp);
}

// ---- cross-entropy ---------------------------------------------------------------------

void CudaBackend::cross_entropy_max(const Tensor& logits, Tensor& row_max) {
  constexpr std::string_view op = "cross_entropy_max";
  const int dt = storage({{"logits", &logits}}, op);
  const void* pl = ptr(logits, op);
  float* pm = f32(row_max, op);
  const std::int64_t V = cols_of(logits, op), N = V == 0 ? 0 : logits.numel() / V;
  must(expect_numel(row_max, N, "row_max"), op);
  if (failed()) return;
  check(kernels::ce_max(pl, dt, pm, N, V, MT_STREAM), op);
}

void CudaBackend::cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                         const Tensor& row_max, std::int64_t vocab_offset,
                                         Tensor& sumexp, Tensor& target_logit) {
  constexpr std::string_view op = "cross_entropy_partials";
  const std::int64_t V = cols_of(logits, op), N = V == 0 ? 0 : logits.numel() / V;
  must(expect_numel(targets, N, "targets"), op);
  must(expect_numel(row_max, N, "row_max"), op);
  must(expect_numel(sumexp, N, "sumexp"), op);
  must(expect_numel(target_logit, N, "target_logit"), op);
  const int dt = storage({{"logits", &logits}}, op);
  const void* pl = ptr(logits, op);
  const float* pm = f32(row_max, op);
  const std::int32_t* pt = i32(targets, op);
  float *ps = f32(sumexp, op), *ptl = f32(target_logit, op);
  if (failed()) return;
  check(kernels::ce_partials(pl, dt, pt, pm, vocab_offset, ps, ptl, N, V, MT_STREAM), op);
}

void CudaBackend::cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                     const Tensor& target_logit, Tensor& losses) {
  constexpr std::string_view op = "cross_entropy_loss";
  const std::int64_t N = row_max.numel();
  must(expect_numel(sumexp, N, "sumexp"), op);
  must(expect_numel(target_logit, N, "target_logit"), op);
  must(expect_numel(losses, N, "losses"), op);
  const float *pm = f32(row_max, op), *ps = f32(sumexp, op), *pt = f32(target_logit, op);
  float* pl = f32(losses, op);
  if (failed()) return;
  check(kernels::ce_loss(pm, ps, pt, pl, N, MT_STREAM), op);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& row_max, const Tensor& sumexp,
                                         std::int64_t vocab_offset, float dloss, Tensor& dlogits) {
  constexpr std::string_view op = "cross_entropy_backward";
  const std::int64_t V = cols_of(logits, op), N = V == 0 ? 0 : logits.numel() / V;
  must(expect_numel(targets, N, "targets"), op);
  must(expect_numel(row_max, N, "row_max"), op);
  must(expect_numel(sumexp, N, "sumexp"), op);
  must(expect_numel(dlogits, logits.numel(), "dlogits"), op);
  const int dt = storage({{"logits", &logits}, {"dlogits", &dlogits}}, op);
  const void* pl = ptr(logits, op);
  const float *pm = f32(row_max, op), *ps = f32(sumexp, op);
  const std::int32_t* pt = i32(targets, op);
  void* pd = ptr(dlogits, op);
  if (failed()) return;
  check(kernels::ce_backward(pl, dt, pt, pm, ps, vocab_offset, dloss, pd, N, V, MT_STREAM), op);
}

void CudaBackend::cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit,
                                         Tensor& correct, bool accumulate) {
  constexpr std::string_view op = "cross_entropy_accuracy";
  const std::int64_t N = row_max.numel();
  must(expect_numel(target_logit, N, "target_logit"), op);
  must(expect_numel(correct, 1, "correct"), op);
  const float *pm = f32(row_max, op), *pt = f32(target_logit, op);
  float* pc = f32(correct, op);
  if (failed()) return;
  check(kernels::ce_accuracy(pm, pt, pc, N, accumulate, MT_STREAM), op);
}

// ---- optimizer -------------------------------------------------------------------------

void CudaBackend::clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) {
  const float* ps = f32(sumsq, "clip_coefficient");
  float* pc = f32(coef, "clip_coefficient");
  must(expect_numel(sumsq, 1, "sumsq"), "clip_coefficient");
  must(expect_numel(coef, 1, "coef"), "clip_coefficient");
  if (failed()) return;
  check(kernels::clip_coefficient(ps, max_norm, pc, MT_STREAM), "clip_coefficient");
}

void CudaBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
                        const AdamWOp& op) {
  const std::int64_t n = param.numel();
  must(expect_numel(grad, n, "grad"), "adamw");
  must(expect_numel(m, n, "m"), "adamw");
  must(expect_numel(v, n, "v"), "adamw");
  if (op.step < 1) misuse("adamw: step {} must be 1-based", op.step);
  float *pp = f32(param, "adamw"), *pm = f32(m, "adamw"), *pv = f32(v, "adamw");
  const float* pg = f32(grad, "adamw");
  const float* pc = nullptr;
  if (coef.defined()) {
    must(expect_numel(coef, 1, "coef"), "adamw");
    pc = f32(coef, "adamw");
  }
  if (failed()) return;
  check(kernels::adamw(pp, pg, pm, pv, pc, n, adamw_args(op, op.weight_decay), MT_STREAM), "adamw");
}

void CudaBackend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp& op) {
  if (params.empty()) return;
  if (!on_host(params.front().param)) {
    foreach_adamw_device(params, coef, op);
    return;
  }
  if (op.step < 1) misuse("foreach_adamw: step {} must be 1-based", op.step);
  HostAdamW update;
  update.op = op;
  for (const AdamWTensors& t : params) {
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      if (!on_host(*x))
        misuse("foreach_adamw: device tensor {} among host tensors: an update runs all on the host or all on the "
               "device", x->shape().str());
    const std::int64_t n = t.param.numel();
    must(expect_numel(t.grad, n, "grad"), "foreach_adamw");
    must(expect_numel(t.m, n, "m"), "foreach_adamw");
    must(expect_numel(t.v, n, "v"), "foreach_adamw");
    update.arrays.push_back({n, f32(t.param, "foreach_adamw"), f32(t.grad, "foreach_adamw"),
                             f32(t.m, "foreach_adamw"), f32(t.v, "foreach_adamw"), t.weight_decay});
  }
  if (coef.defined()) {
    must(expect_numel(coef, 1, "coef"), "foreach_adamw");
    if (on_host(coef)) misuse("foreach_adamw: the clip coefficient must be in device memory");
    if (!coef_host_.defined()) coef_host_ = host_zeros(Shape{1});
    copy(coef, coef_host_);
    update.coef = f32(coef_host_, "foreach_adamw");
  }
  if (failed()) return;
  check(enqueue_host_adamw(stream_handle(), std::move(update)), "foreach_adamw (on the host)");
}

// The update of every tensor in one launch per kMaxForeach tensors: the table
// of pointers travels as the kernel's parameter, so nothing is allocated or
// copied, and each element gets adamw's bits (the same device function).
void CudaBackend::foreach_adamw_device(std::span<const AdamWTensors> params, const Tensor& coef,
                                       const AdamWOp& op) {
  constexpr std::string_view name = "foreach_adamw";
  if (op.step < 1) misuse("foreach_adamw: step {} must be 1-based", op.step);
  std::vector<kernels::AdamWTensor> table;
  table.reserve(params.size());
  for (const AdamWTensors& t : params) {
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      if (on_host(*x))
        misuse("foreach_adamw: host tensor {} among device tensors: an update runs all on the host or all on the "
               "device", x->shape().str());
    const std::int64_t n = t.param.numel();
    must(expect_numel(t.grad, n, "grad"), name);
    must(expect_numel(t.m, n, "m"), name);
    must(expect_numel(t.v, n, "v"), name);
    const kernels::AdamWArgs one = adamw_args(op, t.weight_decay);
    table.push_back({f32(t.param, name), f32(t.grad, name), f32(t.m, name), f32(t.v, name), n, one.decay});
  }
  const float* pc = nullptr;
  if (coef.defined()) {
    must(expect_numel(coef, 1, "coef"), name);
    if (on_host(coef)) misuse("foreach_adamw: the clip coefficient must be in device memory");
    pc = f32(coef, name);
  }
  if (failed()) return;
  const kernels::AdamWArgs a = adamw_args(op, 0.f);  // decay comes from each entry
  for (std::size_t b = 0; b < table.size(); b += kernels::kMaxForeach) {
    const int count = static_cast<int>(std::min<std::size_t>(kernels::kMaxForeach, table.size() - b));
    check(kernels::foreach_adamw(table.data() + b, count, pc, a, MT_STREAM), name);
  }
}

// ---- initialisation ----------------------------------------------------------------------

void CudaBackend::init_normal(Tensor& x, const NormalInitOp& op) {
  if (on_host(x)) {  // page-locked host memory: drawn on the host, as write() fills it
    Backend::init_normal(x, op);
    return;
  }
  const int dt = storage({{"x", &x}}, "init_normal");
  void* px = ptr(x, "init_normal");
  if (const auto bad = normal_init_misuse(x, op)) misuse("{}", *bad);
  if (failed()) return;
  // kMaxNormalRuns runs per launch; the first launch also zeroes what no run
  // covers, the later ones write only their own runs' columns.
  kernels::NormalInitArgs a{};
  a.key = op.key;
  a.stddev = op.stddev;
  a.cols = op.cols;
  a.row_stride = op.row_stride;
  std::size_t b = 0;
  do {
    a.nruns = static_cast<int>(std::min<std::size_t>(kernels::kMaxNormalRuns, op.runs.size() - b));
    a.zero_rest = b == 0;
    for (int k = 0; k < a.nruns; ++k) {
      const NormalInitOp::Run& r = op.runs[b + static_cast<std::size_t>(k)];
      a.runs[k] = {r.col, r.width, r.counter};
    }
    check(kernels::init_normal(px, dt, x.numel(), a, MT_STREAM), "init_normal");
    b += static_cast<std::size_t>(a.nruns);
  } while (b < op.runs.size());
}

}  // namespace meshtrain::cuda
