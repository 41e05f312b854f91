#include "backends/cuda/cuda_factory.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string_view>

#include "backends/cuda/cuda_backend.h"

namespace meshtrain {

bool cuda_backend_built() { return true; }

std::string cuda_device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

Result<std::function<void()>> cuda_fp8_gemm_call(Backend& backend, std::int64_t m, std::int64_t n, std::int64_t k,
                                                 bool split_accumulator) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cuda == nullptr)
    return make_error("FP8 GEMMs are measured on the cuda backend, not on '{}'", backend.name());
  return cuda->fp8_gemm_call(m, n, k, split_accumulator);
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  if (cuda::device_count() == 0)
    return make_error(
        "no CUDA device found (cudaGetDeviceCount sees none: no GPU, no driver, or "
        "CUDA_VISIBLE_DEVICES hides them); use --backend cpu on this machine");
  cuda::CudaOptions o;
  o.device = options.device;
  o.use_mpi = options.use_mpi;
  o.comm_timeout = options.comm_timeout;
  // The tuned attention kernels stay opt-in until a GPU run has verified them
  // (CudaOptions::tuned_attention); an unknown value is refused, not ignored.
  if (const char* v = std::getenv("MESHTRAIN_CUDA_ATTENTION")) {
    const std::string_view choice = v;
    if (choice != "tuned" && choice != "reference")
      return make_error("MESHTRAIN_CUDA_ATTENTION is '{}'; set it to 'tuned' or 'reference', or unset it (reference)",
                        choice);
    o.tuned_attention = choice == "tuned";
  }
  MT_ASSIGN(std::unique_ptr<cuda::CudaBackend> b, cuda::CudaBackend::create(o));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace meshtrain
