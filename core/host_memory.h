// How much memory this process may use, so that work whose size follows from
// user input (a model, a batch, a cluster) is refused with the figure before
// it allocates, instead of running the machine out of memory or aborting.
#pragma once

#include <string_view>

#include "core/status.h"

namespace meshtrain {

// Physical memory, or the cgroup's limit (containers, Slurm) when lower.
double host_memory_bytes();

// An Error unless `bytes` fits in host_memory_bytes():
// "<what> needs about 12.00 GiB, but this machine has 7.50 GiB of memory; <fix>".
Status check_host_memory(double bytes, std::string_view what, std::string_view fix);

}  // namespace meshtrain
