// make_cuda_backend in a build without the cuda backend (see cuda_factory.h).
#include "backends/cuda/cuda_factory.h"

namespace meshtrain {

bool cuda_backend_built() { return false; }

std::string cuda_device_name() { return ""; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error(
      "this meshtrain was built without CUDA: configure found no nvcc, CUDA Toolkit or NCCL (see "
      "the 'cuda backend SKIPPED' message of cmake), or ran with -DMESHTRAIN_CUDA=OFF; rebuild "
      "where they are installed, or use --backend cpu");
}

}  // namespace meshtrain
