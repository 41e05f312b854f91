// make_cuda_backend in a build without the cuda backend (see cuda_factory.h).
#include "backends/cuda/cuda_factory.h"

namespace meshtrain {

bool cuda_backend_built() { return false; }

std::string cuda_device_name() { return ""; }

Result<std::function<void()>> cuda_fp8_gemm_call(Backend&, std::int64_t, std::int64_t, std::int64_t, bool) {
  return make_error("FP8 GEMMs are measured on the cuda backend, and this meshtrain was built without CUDA");
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error(
      "this meshtrain was built without CUDA: configure found no nvcc, CUDA Toolkit or NCCL (see "
      "the 'cuda backend SKIPPED' message of cmake), or ran with -DMESHTRAIN_CUDA=OFF; rebuild "
      "where they are installed, or use --backend cpu");
}

}  // namespace meshtrain
