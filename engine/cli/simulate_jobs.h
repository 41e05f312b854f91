// `meshtrain simulate --job A.json --job B.json`: several jobs on one
// cluster (engine/simulation/shared_fabric.h), printed as a table or JSON.
#pragma once

#include <string>
#include <vector>

#include "engine/simulation/simulation.h"

namespace meshtrain {

Status run_simulate_jobs(const std::vector<std::string>& files, const SimulateOptions& options, int num_gpus,
                         bool json);

}  // namespace meshtrain
