#include "backends/cuda/device_select.h"

namespace meshtrain::cuda {

Result<int> select_device(std::optional<int> local_rank, int device_count) {
  if (device_count <= 0) return make_error("no CUDA device is visible to this process");
  if (device_count == 1 || !local_rank) return 0;
  if (*local_rank >= device_count)
    return make_error(
        "local rank {} has no GPU: this node shows {} devices; launch at most {} ranks per node "
        "or set CUDA_VISIBLE_DEVICES",
        *local_rank, device_count, device_count);
  return *local_rank;
}

}  // namespace meshtrain::cuda
