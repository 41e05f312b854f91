#include "backends/cuda/gemm.h"

#include <cublasLt.h>

#include <fmt/format.h>

namespace meshtrain::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

cudaDataType_t cuda_type(Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// What cuBLASLt's FP8 GEMMs take (its documented FP8 requirements): both operands K-major, not both E5M2,
// a bf16 output.
Status check_fp8(const GemmCall& g) {
  if (g.trans_a || !g.trans_b)
    return make_error("cuBLASLt FP8 GEMMs read both operands K-major: a as (m, k) and b stored as (n, k) "
                      "(trans_b, not trans_a); got trans_a {} trans_b {}",
                      g.trans_a, g.trans_b);
  if (g.fp8.a == Fp8Format::e5m2 && g.fp8.b == Fp8Format::e5m2)
    return make_error("cuBLASLt has no FP8 GEMM of two E5M2 operands; cast one as E4M3");
  if (g.out != DType::bf16) return make_error("FP8 GEMMs here write bf16, got {}", dtype_name(g.out));
  if (g.fp8.a_scale == nullptr || g.fp8.b_scale == nullptr) return make_error("an FP8 GEMM needs both operands' device scales");
  return ok_status();
}

Status lt(cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return make_error("cuBLASLt {}: {} ({})", what, cublasGetStatusString(s), static_cast<int>(s));
}

int alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % static_cast<std::uintptr_t>(align) != 0) align /= 2;
  return align;
}

}  // namespace

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our b), B (our a)
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Result<std::unique_ptr<GemmRunner>> GemmRunner::create(CachingAllocator& allocator) {
  cublasLtHandle_t h = nullptr;
  MT_TRY(lt(cublasLtCreate(&h), "create"));
  return std::unique_ptr<GemmRunner>(new GemmRunner(allocator, h));
}

GemmRunner::GemmRunner(CachingAllocator& allocator, void* handle)
    : allocator_(allocator), handle_(handle) {}

GemmRunner::~GemmRunner() {
  plans_.clear();
  for (const auto& w : workspaces_)
    if (w.ptr) allocator_.free(w);
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Result<void*> GemmRunner::workspace(int stream_id) {
  if (workspaces_.size() <= static_cast<std::size_t>(stream_id))
    workspaces_.resize(static_cast<std::size_t>(stream_id) + 1);
  auto& w = workspaces_[static_cast<std::size_t>(stream_id)];
  if (w.ptr == nullptr) {
    MT_ASSIGN(w, allocator_.allocate(kWorkspaceBytes, stream_id));
  }
  return w.ptr;
}

Result<GemmRunner::Plan*> GemmRunner::plan_for(const GemmCall& g) {
  if (g.fp8.on) MT_TRY(check_fp8(g));
  const std::string key =
      fmt::format("{}{} {} {} {} {} {} {} {} {} {} {} {} {} fp8 {} {} {} {}", g.trans_a, g.trans_b, g.batch, g.m,
                  g.n, g.k, static_cast<int>(g.in), static_cast<int>(g.out), g.bias != nullptr,
                  g.beta != 0.f, alignment(g.a), alignment(g.b), alignment(g.c),
                  g.bias ? alignment(g.bias) : 0, g.fp8.on, static_cast<int>(g.fp8.a), static_cast<int>(g.fp8.b),
                  g.fp8.split_accumulator);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  MT_TRY(lt(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  if (g.fp8.on) {
    const std::int8_t fast = g.fp8.split_accumulator ? 0 : 1;
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
              "fast accumulation"));
  }
  // cuBLASLt A = our b: op N when b is (k, n) row-major (= (n, k) col-major).
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "transa"));
  MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "transb"));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue"));
    const cudaDataType_t bt = cuda_type(g.out);
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "bias type"));
  }
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  // Stored shapes, column-major: our b is (n, k) [op N] or (k, n) [op T].
  const std::uint64_t a_rows = g.trans_b ? u(g.k) : u(g.n), a_cols = g.trans_b ? u(g.n) : u(g.k);
  const std::uint64_t b_rows = g.trans_a ? u(g.m) : u(g.k), b_cols = g.trans_a ? u(g.k) : u(g.m);
  // cuBLASLt's A is our b, its B our a.
  const cudaDataType_t type_a = g.fp8.on ? cuda_type(g.fp8.b) : cuda_type(g.in);
  const cudaDataType_t type_b = g.fp8.on ? cuda_type(g.fp8.a) : cuda_type(g.in);
  MT_TRY(lt(cublasLtMatrixLayoutCreate(&plan->a, type_a, a_rows, a_cols, static_cast<std::int64_t>(a_rows)), "layout a"));
  MT_TRY(lt(cublasLtMatrixLayoutCreate(&plan->b, type_b, b_rows, b_cols, static_cast<std::int64_t>(b_rows)), "layout b"));
  MT_TRY(lt(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(g.out), u(g.n), u(g.m), g.n), "layout c"));
  if (g.batch > 1) {
    const auto count = static_cast<std::int32_t>(g.batch);
    const std::int64_t strides[3] = {g.n * g.k, g.m * g.k, g.m * g.n};
    cublasLtMatrixLayout_t layouts[3] = {plan->a, plan->b, plan->c};
    for (int i = 0; i < 3; ++i) {
      MT_TRY(lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch"));
      MT_TRY(lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]), "stride"));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  MT_TRY(lt(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  const std::uint64_t ws = kWorkspaceBytes;
  const std::uint32_t al_a = static_cast<std::uint32_t>(alignment(g.b)),
                      al_b = static_cast<std::uint32_t>(alignment(g.a)),
                      al_c = static_cast<std::uint32_t>(alignment(g.c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
      1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MT_TRY(lt(hs, "heuristic"));
  if (found == 0)
    return make_error("cuBLASLt has no algorithm for {}x{}x{} (batch {}) {} -> {}{}", g.m, g.n, g.k, g.batch,
                      g.fp8.on ? "fp8" : dtype_name(g.in), dtype_name(g.out),
                      g.fp8.on ? " (FP8 GEMMs need a device of compute capability 8.9 or later and k, "
                                 "and the leading dimensions, multiples of 16)"
                               : "");
  plan->algo = result.algo;
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

Status GemmRunner::run(const GemmCall& g, cudaStream_t stream) {
  MT_ASSIGN(Plan* plan, plan_for(g));
  MT_ASSIGN(void* ws, workspace(g.stream_id));
  if (g.bias)
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                             &g.bias, sizeof g.bias),
              "bias pointer"));
  if (g.fp8.on) {
    // cuBLASLt's A is our b: its scale is b's.
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.fp8.b_scale,
                                             sizeof g.fp8.b_scale),
              "a scale pointer"));
    MT_TRY(lt(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.fp8.a_scale,
                                             sizeof g.fp8.a_scale),
              "b scale pointer"));
  }
  return lt(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &g.alpha, g.b,
                           plan->a, g.a, plan->b, &g.beta, g.c, plan->c, g.c, plan->c, &plan->algo,
                           ws, kWorkspaceBytes, stream),
            "matmul");
}

}  // namespace meshtrain::cuda
