#include "backends/cuda/watchdog.h"

#include <algorithm>

namespace meshtrain::cuda {

void Watchdog::track(std::string op, int group, std::string peers, Clock::time_point issued,
                     std::function<bool()> done) {
  std::lock_guard lock(mu_);
  ops_.push_back(Op{std::move(op), group, std::move(peers), issued, std::move(done)});
}

std::optional<Error> Watchdog::poll(Clock::time_point now, const AsyncError& async_error) {
  std::lock_guard lock(mu_);
  std::erase_if(ops_, [](Op& o) { return o.done(); });
  for (const Op& o : ops_)
    if (auto failure = async_error(o.group))
      return make_error("rank {}: {} on group {} (ranks {}) failed: {}", rank_, o.op, o.group,
                        o.peers, *failure);
  for (const Op& o : ops_) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - o.issued);
    if (waited > timeout_)
      return make_error(
          "rank {}: {} on group {} (ranks {}) timed out after {} ms (limit {} ms): a peer did not "
          "take part (dead, stuck, or issuing collectives in another order)",
          rank_, o.op, o.group, o.peers, waited.count(), timeout_.count());
  }
  return std::nullopt;
}

std::size_t Watchdog::in_flight() const {
  std::lock_guard lock(mu_);
  return ops_.size();
}

}  // namespace meshtrain::cuda
