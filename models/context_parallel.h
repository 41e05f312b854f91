// Context parallelism: each sequence split over the N ranks of a context
// group, as Llama 3 trains its 128K-token sequences (Dubey et al. 2024,
// Sec. 3.3.2).
//
// Layout: a sequence of T tokens is cut into 2N chunks of c = T/(2N); rank
// r holds chunks r and 2N-1-r, in that order (its T/N tokens are "local").
// Under causal attention a chunk's work grows with its position, so pairing
// an early chunk with a late one gives every rank the same work. Everything
// outside attention is per token and runs on the local tokens as if they
// were a shorter sequence; positions (learned or RoPE) are the tokens'
// global ones.
//
// Attention: every rank needs the keys and values of the whole sequence.
// With `all_gather` (Llama 3's choice) the local K and V rows are
// all-gathered over the group before attention, and in backward their
// gradients are reduce-scattered back to the ranks that own them; each rank
// then computes its two chunks' query rows against the keys before them
// (AttentionOp's query window): the chunk pairs (i, j <= i) of the causal
// score matrix. With `ring` (ring attention, Liu et al. 2023) the blocks
// travel round the group by send/recv on a stream of their own, one
// neighbour step at a time (N - 1 steps), and each rank attends to a block
// while the next one is in flight: one attention per (local query chunk,
// block chunk) pair, merged into the running result through the parts'
// log-sum-exps (Backend::attention_merge). In backward every pair's share of
// the gradients comes from the merged output and log-sum-exp; the K and V
// gradients of a block travel on as a running sum while the next block's
// share is computed, and arrive summed at their owner. The ring's blocks
// carry K already rotated at its global positions. Merging changes the order
// of the softmax's sums, so ring and all-gather agree to rounding, not in
// every bit.
// Legend: B samples, T the whole sequence, L = T/N local tokens per sample,
// c = T/(2N) a chunk, N_l = B·L local rows, H/G query/kv heads on this rank,
// D head dim, S = H + 2G head slots of a qkv row.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain {

enum class ContextComm { all_gather, ring };
std::string context_comm_name(ContextComm c);
Result<ContextComm> parse_context_comm(const std::string& s);

// Send/recv tags of the ring exchange (0..2N-3), above every pipeline tag.
inline constexpr int kContextRingTag = 1 << 28;

struct ContextParallel {
  Group group;  // the context-parallel group (size 1 without cp)
  int rank = 0;
  int size = 1;
  ContextComm comm = ContextComm::all_gather;
};

// The global position of each of rank `rank`'s L local tokens of a sequence
// of `seq` tokens split over `size` ranks: chunk rank, then chunk
// 2·size-1-rank. `seq` must divide by 2·size.
std::vector<std::int32_t> context_positions(std::int64_t seq, int size, int rank);
// Whether a plan's sequence can be split: an Error names the numbers.
Status check_context_split(std::int64_t seq, int size);

class BlockContext;
struct AttentionOp;

// One layer's attention over the whole sequence from this rank's local qkv
// rows, with what its backward needs.
struct ContextAttentionSaved {
  Tensor exchanged;  // (N_l·S + N·N_l·2G, D): the local qkv rows (ring: rotated), then every rank's K and V rows
  Tensor out;        // (2·B·c, H·D): the two chunks' attention outputs, chunk-major
  Tensor lse;        // (2, B, H, c)
};
// qkv (N_l, S·D), not yet rotated -> the attention output (N_l, H·D) of the
// local tokens. `op` gives heads and scale (causal or not); `rope_theta` > 0
// rotates q and k by their global positions.
Tensor context_attention_forward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& qkv,
                                 const AttentionOp& op, float rope_theta, ContextAttentionSaved& saved);
// dattn (N_l, H·D) -> dqkv (N_l, S·D), the gradient of the unrotated local
// qkv rows: each rank's K and V rows get the sum over every rank's queries.
Tensor context_attention_backward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& dattn,
                                  const AttentionOp& op, float rope_theta, const ContextAttentionSaved& saved);

}  // namespace meshtrain
