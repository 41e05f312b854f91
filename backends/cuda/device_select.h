// Which GPU a rank drives: the launcher's local rank (ranks of one node are
// numbered 0.. on that node) indexes the node's visible devices. Pure logic,
// tested without a device.
#pragma once

#include <functional>
#include <optional>

#include "core/status.h"

namespace meshtrain::cuda {

using EnvLookup = std::function<const char*(const char*)>;

// The first of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun), SLURM_LOCALID
// (srun) and LOCAL_RANK (torchrun-style launchers) that is set; nullopt when
// none is. Fails on a value that is not a non-negative integer. Default
// `getenv` is the process environment.
Result<std::optional<int>> local_rank_from_env(const EnvLookup& getenv = {});

// The device index for `local_rank` among `device_count` visible devices:
// with one visible device it is 0 (the launcher already bound one GPU per
// rank through CUDA_VISIBLE_DEVICES); without a local rank it is 0; otherwise
// the local rank itself, which must be < device_count.
Result<int> select_device(std::optional<int> local_rank, int device_count);

}  // namespace meshtrain::cuda
