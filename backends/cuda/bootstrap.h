// Creating an NCCL communicator needs one unique id, made by one member and
// known to all: the group's first (lowest) rank makes it and sends it to the
// other members over a host channel (MPI in a real job: MpiIdChannel,
// backends/comm/id_channel.h).
// The logic is free of NCCL and MPI so it is tested with a fake channel.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <span>

#include "backends/backend.h"
#include "backends/comm/id_channel.h"
#include "core/status.h"

namespace meshtrain::cuda {

inline constexpr std::size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using UniqueId = std::array<std::byte, kUniqueIdBytes>;

// The tag of group `g`'s id messages: its id folded into MPI's guaranteed tag
// range. Two groups may share a tag: each pair of ranks initialises its common
// groups in the same order, and same-tag messages do not overtake each other.
int bootstrap_tag(const Group& g);

// On g.ranks[0]: make_id(), then send it to every other member in rank order.
// On the others: receive it from g.ranks[0]. Fails if `my_rank` is not a
// member or the channel fails; errors name the group and the peer.
Result<UniqueId> share_unique_id(IdChannel& channel, const Group& g, int my_rank,
                                 const std::function<Result<UniqueId>()>& make_id);

}  // namespace meshtrain::cuda
