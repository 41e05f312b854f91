#include "backends/cuda/device_select.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace meshtrain::cuda {

Result<std::optional<int>> local_rank_from_env(const EnvLookup& getenv) {
  const EnvLookup get = getenv ? getenv : [](const char* k) -> const char* { return std::getenv(k); };
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = get(var);
    if (v == nullptr) continue;
    int value = -1;
    const char* end = v + std::strlen(v);
    auto [p, ec] = std::from_chars(v, end, value);
    if (ec != std::errc() || p != end || p == v || value < 0)
      return make_error("{}='{}' is not a local rank (a non-negative integer)", var, v);
    return std::optional<int>(value);
  }
  return std::optional<int>();
}

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
