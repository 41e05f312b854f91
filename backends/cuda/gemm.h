// Row-major GEMMs of backends/backend.h through cuBLASLt.
//
// cuBLASLt is column-major. A row-major (r, c) matrix is the column-major
// (c, r) matrix of its transpose, so c = op(a) op(b) is computed as
// cᵀ = op(b)ᵀ op(a)ᵀ: cuBLASLt's "A" is our b, its "B" our a, and no data
// moves. The bias (n) of each row of c is then a bias per row of the
// column-major cᵀ, which is what CUBLASLT_EPILOGUE_BIAS adds.
//
// Compute in fp32 (CUBLAS_COMPUTE_32F, never TF32) for every input dtype.
// FP8 operands (GemmCall::fp8, sm_89 and later) as Transformer Engine's
// linears run them: E4M3 or E5M2 bytes, each with a device f32 scale that
// multiplies the product (its dequantization scale), a bf16 output, and the
// tensor cores' fast accumulator or the split one (partial sums promoted to
// fp32 as K advances; CUBLASLT_MATMUL_DESC_FAST_ACCUM off), which TE uses
// for its dgrad and wgrad. cuBLASLt's FP8 kernels read both operands
// K-major: a (m, k) and b stored (n, k), i.e. trans_b and not trans_a.
// Plans (descriptors and the heuristic's algorithm) are cached by shape,
// dtypes, bias and pointer alignment; each stream has its own workspace so
// GEMMs on different streams never share one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/caching_allocator.h"
#include "core/fp8.h"
#include "core/status.h"

namespace meshtrain::cuda {

struct GemmCall {
  bool trans_a = false, trans_b = false;
  std::int64_t batch = 1, m = 0, n = 0, k = 0;  // a (m, k) [(k, m) if trans_a], b (k, n) [(n, k)]
  float alpha = 1.f, beta = 0.f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // (n) of c's dtype, or null
  DType in = DType::f32;       // a and b
  DType out = DType::f32;      // c and bias
  int stream_id = 0;
  // FP8 operands (see above): a and b hold FP8 bytes and `in` is not read; `out` must be bf16.
  struct Fp8 {
    bool on = false;
    Fp8Format a = Fp8Format::e4m3, b = Fp8Format::e4m3;
    const float* a_scale = nullptr;  // device f32 (1): multiplies the product
    const float* b_scale = nullptr;
    bool split_accumulator = false;
  } fp8{};
};

class GemmRunner {
 public:
  static constexpr std::size_t kWorkspaceBytes = 32u << 20;

  static Result<std::unique_ptr<GemmRunner>> create(CachingAllocator& allocator);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Requires k > 0 and m, n > 0 (the backend handles the degenerate cases).
  Status run(const GemmCall& call, cudaStream_t stream);

 private:
  struct Plan;
  GemmRunner(CachingAllocator& allocator, void* handle);
  Result<Plan*> plan_for(const GemmCall& call);
  Result<void*> workspace(int stream_id);

  CachingAllocator& allocator_;
  void* handle_;  // cublasLtHandle_t
  std::unordered_map<std::string, std::unique_ptr<Plan>> plans_;
  std::vector<CachingAllocator::Allocation> workspaces_;  // by stream id
};

}  // namespace meshtrain::cuda
