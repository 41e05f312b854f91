// MoE dispatch on the host: from the router's choices to the index maps and
// per-peer counts that move a micro-batch's tokens to the ranks holding their
// experts and back (models/moe_layer.h issues the ops). Pure functions of
// their inputs, so every plan computes the same routing and the same drops.
//
// Capacity and the drop order. With capacity_factor c > 0 an expert takes at
// most ceil(c · N · K / E) assignments of a micro-batch's N tokens (K experts
// per token, E experts): the first ones in token order, and within a token in
// slot order (its most probable expert first); the rest are dropped (the
// token's output lacks that expert's term; with every slot dropped it is
// zero and the residual carries the token). The decision is made over the
// whole micro-batch before it is split among ranks, so it is the same at
// every plan. c = 0 is dropless.
//
// Expert parallelism. The E experts are split in ep contiguous ranges of
// E/ep ("local experts"); EP rank q holds experts [q·E/ep, (q+1)·E/ep). A
// rank sends its kept assignments in send order — sorted by expert, then
// token, then slot — so each peer's rows are one contiguous block, and
// receives from peer q (in peer order) q's rows for its local experts, in
// q's send order. With expert tensor parallelism (etp > 1, Megatron-Core's
// all-to-all dispatcher) the etp ranks sharing a slice of the same experts
// each dispatch their own tokens and then all-gather what they received
// (padded to the largest, as the collective needs equal blocks): etp rank t's
// rows are block t of the gathered buffer. The rows are regrouped by local
// expert (expert, then etp rank, then EP peer, then the peer's order) for
// one GEMM per expert, and on the way back scattered to their blocks (each
// etp rank's summed by a reduce-scatter) before the all-to-all back.
//
// Legend: N tokens of the micro-batch, K slots per token, E experts, D rows
// this rank dispatches (a contiguous range of the N), S rows it sends, R rows
// it receives, El = E / ep local experts.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

// ceil(capacity_factor · tokens · top_k / experts); 0 means no limit (dropless).
std::int64_t expert_capacity(float capacity_factor, std::int64_t tokens, int top_k, int experts);

struct RoutingSummary {
  std::vector<std::int64_t> routed;  // (E) assignments of the N tokens per expert, before drops
  std::vector<bool> kept;            // (N·K) whether slot (n, k) reaches its expert
  std::int64_t dropped = 0;          // assignments dropped by the capacity
};
// `experts` (N·K) as moe_route wrote them; capacity 0: keep every one.
RoutingSummary summarize_routing(const std::vector<std::int32_t>& experts, int num_experts, std::int64_t capacity);

struct SendPlan {
  std::vector<std::int64_t> peer_rows;    // (ep) rows sent to each EP peer
  std::vector<std::int32_t> expert_rows;  // (E) rows sent to each expert (the counts peers exchange)
  std::vector<std::int32_t> send_index;   // (S) the dispatched row (0..D-1) of each sent row
  std::vector<std::int32_t> slot_index;   // (D·K) the sent row of slot (n, k), -1 when dropped
};
// Rows [first, first + rows) of the micro-batch are this rank's to dispatch.
SendPlan plan_send(const std::vector<std::int32_t>& experts, const RoutingSummary& routing, int top_k,
                   int num_experts, int ep, std::int64_t first, std::int64_t rows);

struct ReceivePlan {
  std::vector<std::int64_t> peer_rows;    // (ep) rows this rank receives from each peer
  std::int64_t block_rows = 0;            // rows of an etp rank's block: the most any of them received
  std::vector<std::int64_t> expert_rows;  // (El) rows of each local expert, over all peers and etp ranks
  // (M) the row of the (etp · block_rows) gathered buffer behind each expert-grouped row.
  std::vector<std::int32_t> group_index;
  // (etp · block_rows) the grouped row behind each gathered row; -1 for padding.
  std::vector<std::int32_t> ungroup_index;
};
// `counts` (etp · ep · El): for etp rank t, from EP peer q, the rows for each
// local expert (what q's SendPlan::expert_rows holds for them); this rank is
// etp rank `me`.
ReceivePlan plan_receive(const std::vector<std::int64_t>& counts, int ep, int etp = 1, int me = 0);
// The same plan's counts only (peer_rows, block_rows, expert_rows), without the index maps.
ReceivePlan receive_counts(const std::vector<std::int64_t>& counts, int ep, int etp = 1, int me = 0);

// The routing the sim backend assumes in place of the data it does not hold
// (models/moe_routing.h): `shares` (E) of the assignments per expert. The
// plans of the EP rank whose local experts receive the most, as if every
// peer (and every etp rank) routed its D tokens by the same shares: what it sends (D·K
// assignments split over the experts by largest remainder, capped) and what it
// receives, as counts only: no index maps (send_index, slot_index,
// group_index, ungroup_index stay empty), whose lengths follow from the counts
// and whose contents the sim backend would not read; building them cost host
// time and memory in proportion to the tokens, every MoE layer and micro-batch.
struct ModelledDispatch {
  RoutingSummary routing;  // over the micro-batch's N tokens
  SendPlan send;
  ReceivePlan receive;
  int busiest_rank = 0;    // the EP rank this plan is for
};
ModelledDispatch modelled_dispatch(const std::vector<double>& shares, std::int64_t tokens, std::int64_t rows,
                                   int top_k, int ep, std::int64_t capacity, int etp = 1);

}  // namespace meshtrain
