// The one check of a counter-based initialisation's layout (Backend::init_normal,
// NormalInitOp) that every backend drawing on its own runs before it draws:
// x holds whole rows of op.cols columns, and the runs are sorted, disjoint and
// within a row. Returns the misuse message, or nothing; each backend aborts
// with it through its own misuse(), which names the backend.
#pragma once

#include <optional>
#include <string>

#include <fmt/format.h>

#include "backends/backend.h"

namespace meshtrain {

inline std::optional<std::string> normal_init_misuse(const Tensor& x, const NormalInitOp& op) {
  if (op.cols <= 0 || x.numel() % op.cols != 0)
    return fmt::format("init_normal: {} is not a whole number of rows of {}", x.shape().str(), op.cols);
  std::int64_t end = 0;
  for (const NormalInitOp::Run& r : op.runs) {
    if (r.col < end || r.width < 0 || r.col + r.width > op.cols)
      return fmt::format("init_normal: runs must be sorted, disjoint and within {} columns", op.cols);
    end = r.col + r.width;
  }
  return std::nullopt;
}

}  // namespace meshtrain
