// Which GPU a rank drives: the launcher's local rank (ranks of one node are
// numbered 0.. on that node; local_rank_from_env, backends/comm/launch.h)
// indexes the node's visible devices. Pure logic, tested without a device.
#pragma once

#include <optional>

#include "core/status.h"

namespace meshtrain::cuda {

// The device index for `local_rank` among `device_count` visible devices:
// with one visible device it is 0 (the launcher already bound one GPU per
// rank through CUDA_VISIBLE_DEVICES); without a local rank it is 0; otherwise
// the local rank itself, which must be < device_count.
Result<int> select_device(std::optional<int> local_rank, int device_count);

}  // namespace meshtrain::cuda
