// Programming errors in the use of the cuda backend abort with a message
// (backends/misuse.h).
#pragma once

#include "backends/misuse.h"

namespace meshtrain::cuda {

inline constexpr Misuse<"cuda"> misuse;

}  // namespace meshtrain::cuda
