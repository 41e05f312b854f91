// Schedule builders: pure functions from a layout to the compute actions of
// every pipeline rank (no sends or receives; see communication.h). Each
// rejects a layout it cannot run with an Error naming the numbers and the fix.
#pragma once

#include <string_view>

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

// The one schedule enum of the project: Plan::schedule (engine/plan/plan.h) holds
// it too, so the trainer passes a plan's schedule straight to build_schedule.
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };

// "gpipe", "1f1b", "interleaved", "zb-h1": the names the CLI (--schedule), JSON plans
// and checkpoints use, so they must not change. An unknown name suggests the
// nearest.
Result<ScheduleKind> parse_schedule_kind(std::string_view name);
std::string_view schedule_kind_name(ScheduleKind kind);

// GPipe: every rank runs F0..F(m-1), then B0..B(m-1) (PyTorch ScheduleGPipe
// order). Needs v = 1. Every rank holds all m microbatches at the peak.
Result<Schedule> build_gpipe(const PipelineLayout& layout);

// 1F1B, as Megatron's forward_backward_pipelining_without_interleaving: rank r
// runs w = min(p-r-1, m) warm-up forwards, then m-w pairs (forward w+i,
// backward i), then the w remaining backwards. Needs v = 1. At most
// min(p-r, m) microbatches are in flight on rank r.
Result<Schedule> build_1f1b(const PipelineLayout& layout);

// Interleaved 1F1B, as Megatron's forward_backward_pipelining_with_interleaving.
// The k-th forward (k = 0..m·v-1) of a rank runs
//   chunk      (k mod p·v) / p                  (get_model_chunk_id)
//   microbatch (k / (p·v))·p + k mod p          (get_microbatch_id_in_model_chunk)
// and the k-th backward the same microbatch on chunk v-1-(k mod p·v)/p, so
// microbatches move through the chunks in groups of p. Rank r warms up with
//   w = min((p-r-1)·2 + (v-1)·p, m·v)
// forwards, then alternates forward w+i / backward i, then drains the
// backwards. When m = p Megatron runs all forwards first (w = m·v) and so do
// we. Needs v >= 2 and m a multiple of p (the groups of p must be whole).
Result<Schedule> build_interleaved_1f1b(const PipelineLayout& layout);

// Warm-up forwards of rank r in the interleaved schedule (w above), so
// callers can size activation memory without building the schedule.
int interleaved_warmup(const PipelineLayout& layout, int rank);

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1):
// 1F1B's order with each backward split into B (input gradient, on the
// critical path: its send goes out before anything else) and W (weight
// gradients, which nothing downstream waits for). Rank r runs 1F1B's
// w = min(p-r-1, m) warm-up forwards and F/B pairs, and W of micro-batch j
// after B of micro-batch j + r (the rest after the last B): later stages,
// whose 1F1B memory is smallest, hold their W's longest, so no rank has
// more than min(p, m) micro-batches between F and W, 1F1B's peak (rank 0),
// and with F = B = W the bubble falls from 1F1B's (p-1)(F+B+W) to
// (p-1)(F+B-W). Needs v = 1. Numerically the same as 1F1B: every
// parameter's gradient sums the micro-batches in the same order.
Result<Schedule> build_zb_h1(const PipelineLayout& layout);

Result<Schedule> build_schedule(ScheduleKind kind, const PipelineLayout& layout);

}  // namespace meshtrain::schedule
