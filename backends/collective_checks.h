// The argument rules of the collectives in backends/backend.h, checked the
// same way by every backend. Each function returns the misuse message for a
// call that breaks a rule (the backend aborts with it, prefixed by its name),
// or an empty string for a valid call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "backends/backend.h"

namespace meshtrain {

std::string member_problem(const Group& g, int rank, std::string_view op);
// in (g.size() · n) -> out (n), same dtype.
std::string reduce_scatter_problem(const Tensor& in, const Tensor& out, const Group& g);
// in (n) -> out (g.size() · n), same dtype.
std::string all_gather_problem(const Tensor& in, const Tensor& out, const Group& g);
std::string broadcast_root_problem(const Group& g, int root_global_rank);
// A send's or recv's peer: another rank of the world (rank `rank` of `world_size`).
std::string peer_problem(std::string_view op, int peer, int rank, int world_size);
// One count per member each way, summing to the tensors' sizes; same dtype.
std::string all_to_all_problem(const Tensor& in, std::span<const std::int64_t> send_counts,
                               const Tensor& out, std::span<const std::int64_t> recv_counts,
                               const Group& g);

}  // namespace meshtrain
