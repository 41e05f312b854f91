// Programming errors in the use of the cpu backend abort with a message
// (backends/misuse.h).
#pragma once

#include "backends/misuse.h"

namespace meshtrain::cpu {

inline constexpr Misuse<"cpu"> misuse;

}  // namespace meshtrain::cpu
