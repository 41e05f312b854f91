#include "backends/collective_checks.h"

#include <numeric>

#include <fmt/format.h>

namespace meshtrain {

std::string member_problem(const Group& g, int rank, std::string_view op) {
  if (g.index_of(rank) >= 0) return {};
  return fmt::format("{}: rank {} is not a member of group {}", op, rank, g.id);
}

namespace {

// A collective whose `whole` tensor holds one `block` per member of g, in one dtype.
std::string blocks_problem(std::string_view op, const char* whole_name, const Tensor& whole, const char* block_name,
                           const Tensor& block, const Group& g) {
  if (whole.dtype() != block.dtype()) return fmt::format("{}: in and out dtypes differ", op);
  if (whole.numel() != block.numel() * g.size())
    return fmt::format("{}: {} {} is not {} blocks of {} {}", op, whole_name, whole.shape().str(), g.size(),
                       block_name, block.shape().str());
  return {};
}

}  // namespace

std::string reduce_scatter_problem(const Tensor& in, const Tensor& out, const Group& g) {
  return blocks_problem("reduce_scatter", "in", in, "out", out, g);
}

std::string all_gather_problem(const Tensor& in, const Tensor& out, const Group& g) {
  return blocks_problem("all_gather", "out", out, "in", in, g);
}

std::string peer_problem(std::string_view op, int peer, int rank, int world_size) {
  if (peer >= 0 && peer < world_size && peer != rank) return {};
  return fmt::format("{}: peer {} of rank {} of {}", op, peer, rank, world_size);
}

std::string broadcast_root_problem(const Group& g, int root_global_rank) {
  if (g.index_of(root_global_rank) >= 0) return {};
  return fmt::format("broadcast: root {} is not a member of group {}", root_global_rank, g.id);
}

std::string all_to_all_problem(const Tensor& in, std::span<const std::int64_t> send_counts,
                               const Tensor& out, std::span<const std::int64_t> recv_counts,
                               const Group& g) {
  if (in.dtype() != out.dtype()) return "all_to_all: in and out dtypes differ";
  const auto members = static_cast<std::size_t>(g.size());
  if (send_counts.size() != members || recv_counts.size() != members)
    return fmt::format("all_to_all: {} send and {} recv counts for a group of {}", send_counts.size(),
                       recv_counts.size(), members);
  const std::int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  const std::int64_t got = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  if (sent != in.numel() || got != out.numel())
    return fmt::format("all_to_all: counts sum to {} sent, {} received, tensors hold {} and {}", sent, got,
                       in.numel(), out.numel());
  return {};
}

}  // namespace meshtrain
