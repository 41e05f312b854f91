// Pieces both host communicators share, so that they agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain::comm {

// acc[i] = acc[i] op x[i] for i < n. Folding contributions into acc one at a
// time in ascending group order is what makes every reduction bitwise
// deterministic: both communicators call this in that order and nothing else
// touches the arithmetic (no reassociation, no fused multiply-add).
// max propagates NaN, so the result does not depend on where a NaN sits.
inline void combine(float* acc, const float* x, std::size_t n, ReduceOp op) {
  if (op == ReduceOp::sum) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] = (x[i] > acc[i] || x[i] != x[i]) ? x[i] : acc[i];
  }
}

// memcpy of n floats that accepts null pointers when n is 0.
inline void copy_floats(float* dst, const float* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

std::string_view reduce_op_name(ReduceOp op);

// "group 3 (ranks [1, 3])": how every communicator error names a group.
std::string describe(const Group& g);

// "rank 3" or "ranks 1, 3".
std::string describe_ranks(const std::vector<int>& ranks);

// Checks that g is well formed for `world` (ranks ascending, unique, in range)
// and that `rank` is a member. The error names `op`.
Status check_group(const Group& g, int rank, int world, std::string_view op);

// Element offsets of the blocks of an uneven all-to-all: offsets[i] is the
// sum of counts[0..i). Fails on negative counts or when the total is not
// `total` (the size of the buffer the counts describe).
Result<std::vector<std::size_t>> block_offsets(std::span<const std::int64_t> counts,
                                               std::size_t total, int group_size,
                                               std::string_view what);

}  // namespace meshtrain::comm
