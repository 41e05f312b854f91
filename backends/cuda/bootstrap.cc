#include "backends/cuda/bootstrap.h"

namespace meshtrain::cuda {

int bootstrap_tag(const Group& g) { return g.id & 0x7fff; }

Result<UniqueId> share_unique_id(IdChannel& channel, const Group& g, int my_rank,
                                 const std::function<Result<UniqueId>()>& make_id) {
  if (g.ranks.empty() || g.index_of(my_rank) < 0)
    return make_error("rank {} is not a member of group {}", my_rank, g.id);
  const int root = g.ranks.front();
  const int tag = bootstrap_tag(g);
  UniqueId id{};
  if (my_rank == root) {
    MT_ASSIGN(id, make_id());
    for (int peer : g.ranks) {
      if (peer == root) continue;
      Status s = channel.send(id, peer, tag);
      if (!s.ok())
        return std::move(s).error().context(
            fmt::format("sending the NCCL id of group {} to rank {}", g.id, peer));
    }
    return id;
  }
  Status s = channel.recv(id, root, tag);
  if (!s.ok())
    return std::move(s).error().context(
        fmt::format("receiving the NCCL id of group {} from rank {}", g.id, root));
  return id;
}

}  // namespace meshtrain::cuda
