// GradientBuckets: data-parallel reduction of one model chunk's gradients in
// buckets, each issued on the communication stream as soon as backward has
// finished every gradient in it (overlap with the rest of backward),
// Megatron/DDP style, and the bucket layout that ZeRO shards along.
//
// A bucket is a range [begin, begin + n) of the chunk's flat buffers, padded
// to n_pad = k·dp (k = ceil(n / dp)); dp rank r owns [r·k, (r+1)·k) of it,
// clipped to n (its "owned" range). Flat buffers are in model order
// (embeddings, layers ascending, final norm and head), so buckets finish from
// the last to the first and are issued in that order on every replica.
//
// Two layouts:
//  * ZeRO 0 and 1 (ranges): buckets of about `bucket_elements`, a multiple of
//    dp, cut anywhere. The flat gradient buffer is persistent: micro-batches
//    accumulate into it, and the last micro-batch's backward (arm()) issues
//    each bucket once complete. ZeRO 0 all-reduces (sums) it in place; ZeRO 1
//    reduce-scatters it into the rank's shard buffer (Σ k, its own storage).
//  * ZeRO 2 and 3 (units): one bucket per layer's parameters (the embeddings,
//    each transformer layer, the final norm and head; a tied embedding's copy
//    apart), the unit ZeRO-3 gathers. There is no persistent gradient buffer:
//    before a micro-batch's backward enters a unit's last layer, the unit gets
//    fresh zeroed gradient storage (n_pad, padding included); when backward
//    leaves its first layer, the unit is reduce-scattered and the rank's k
//    summed elements are added to its shard buffer, and the storage is freed.
//    So a rank holds its 1/dp shard plus the units backward is working on,
//    never the whole gradient (Rajbhandari et al. 2020, stage 2), at the cost
//    of one reduce-scatter per micro-batch. With UnitReduce::once_per_step a
//    unit's storage instead stays bound across the micro-batches, which
//    accumulate into it, and only the last micro-batch's backward (arm())
//    reduce-scatters it: one reduce-scatter per step, in ZeRO 1's summation
//    order, for a whole gradient held during backward.
//
// The gradients are summed, not averaged: the engine scales every token's loss
// by 1 / (tokens of the global batch), so the sum over replicas is the gradient
// of the mean token loss over the global batch.
//
// Expert parameters (mixture of experts) are replicated only over the
// expert-data-parallel group (the ranks holding the same experts), not the
// whole data-parallel group: their buckets hold expert parameters only (the
// range layout cuts at every change between dense and expert slots, the unit
// layout gives a layer's experts a unit of their own) and reduce, and shard
// under ZeRO, over that group. Bucket::group says which; owned ranges count
// in that group's ranks.
//
// Deferred buckets (those holding the tied token embedding when pp > 1) are
// reduced only by finish(): both pipeline ends' copies must first be summed
// over the embedding group, which can only happen after the schedule has run.
// Under the unit layout their gradient storage is kept for the iteration.
//
// Each bucket's last reduction of the step calls the `on_reduced` listener
// (notify_reduced or overlap_updates) on the host right after it is issued,
// once per bucket and step; finish() calls it for the buckets that had no
// call by then. The reduction was issued on the communication stream: an
// event recorded there during the call follows it.
//
// Overlapped updates (Plan::overlap_update, overlap_updates()): the optimizer
// reads the reduced gradients on the communication stream, so finish() does
// not make the compute stream wait for the reductions, and begin_step zeroes
// the gradient buffers on the communication stream too (after the previous
// step's updates read them); the first backward of the step waits for that.
//
// Compression (Plan::grad_compression, grad_compression.h): from the step
// after the warm-up on, every bucket's reduction over a group of more than
// one rank sends compressed payloads instead of fp32; the reduction's result
// lands where the uncompressed one would (the flat buffer, or the shard).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "engine/parallel/grad_compression.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"

namespace meshtrain {

struct Bucket {
  std::int64_t begin = 0, size = 0;  // range of the flat buffer
  std::int64_t shard = 0;            // k = ceil(size / dp)
  std::int64_t state_offset = 0;     // first element of this bucket's shard in the rank's shard buffers
  // Layers (LayerHooks numbering) whose forward or backward reads the
  // bucket's parameters and writes their gradients, ascending.
  std::vector<int> uses;
  bool deferred = false;
  int group = 0;  // 0: the data-parallel group; 1: the expert-data-parallel group
  // Under Plan::fp8_param_gather, how many of its elements are weights of FP8
  // linears (is_fp8_linear), gathered at one byte an element as the FP8
  // parameters Megatron-Core keeps in a buffer of their own; else 0.
  std::int64_t fp8_elements = 0;
  std::int64_t owned_begin(int dp_rank) const;  // flat offset of the owned range
  std::int64_t owned_size(int dp_rank) const;   // its length, <= shard
};

// Megatron-Core's gradient bucket size (DistributedDataParallel, r0.8 and
// later) in elements: max(40M, 1M·dp) on pipeline stage 0's first model
// chunk, so that each NCCL ring step of a large data-parallel group still
// moves enough to be bandwidth-bound; no bucketing (one bucket, the whole
// chunk) on later stages, whose gradients are reduced while stage 0 still
// drains the pipeline, and on later model chunks.
std::int64_t megatron_bucket_elements(int dp, int pipeline_stage, int model_chunk);

// Where a chunk's parameter is used (LayerHooks numbering): its layer, and
// for the tied token embedding also the head (L) when the chunk has it.
std::vector<int> parameter_uses(const ModelSpec& m, const ParamInfo& info, bool chunk_has_head);

// The plan's gradient compression, as the buckets apply it.
struct BucketCompression {
  GradCompression kind = GradCompression::none;
  int warmup = 0;  // steps reduced uncompressed first
  bool error_feedback = true;
};

// When the unit layout (ZeRO 2/3) reduce-scatters: after each micro-batch's
// backward, or once per step (Plan::zero_reduce_once).
enum class UnitReduce { per_microbatch, once_per_step };

class GradientBuckets {
 public:
  // `zero` is the plan's ZeRO stage: it picks the layout and the reduction.
  // `expert_data` is the group that expert parameters reduce over (ignored
  // when the chunk holds none). `fp8_params`: Plan::fp8_param_gather (fills
  // Bucket::fp8_elements).
  GradientBuckets(Backend& b, const ModelSpec& m, ParameterStore& params, bool chunk_has_head, Group dp, int zero,
                  std::int64_t bucket_elements, bool defer_embedding, Stream compute, Stream comm,
                  Group expert_data = {}, BucketCompression compression = {},
                  UnitReduce unit_reduce = UnitReduce::per_microbatch, bool fp8_params = false);
  // All-gathers `in` into `out` over bucket k's group: its FP8 parameters at
  // one byte an element (Backend::all_gather_fp8) where k has any.
  void gather(const Bucket& k, const Tensor& in, Tensor& out) const;

  // Starts iteration `step` (1-based): nothing issued, nothing armed, shards
  // zeroed; compressed once step is past the warm-up.
  void begin_step(std::int64_t step);
  // Range layout: the next backward through this chunk is its last of the
  // iteration, from now on after_backward issues the buckets it completes.
  void arm() { armed_ = true; }
  // The chunk's backward hooks (LayerHooks).
  void before_backward(int layer);
  void after_backward(int layer);
  // Reduces every bucket not reduced yet (the deferred ones) and makes the
  // compute stream wait for all reductions (unless updates overlap).
  void finish();
  // Overlapped updates from now on (see above); `on_reduced` may be empty.
  void overlap_updates(std::function<void(std::size_t bucket)> on_reduced);
  // The on_reduced listener alone (see above), the updates not overlapped.
  void notify_reduced(std::function<void(std::size_t bucket)> on_reduced) { on_reduced_ = std::move(on_reduced); }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The group a bucket reduces (and ZeRO shards) over, and this rank's index in it.
  const Group& group_of(const Bucket& k) const { return k.group == 0 ? dp_ : expert_data_; }
  int rank_in(const Bucket& k) const { return k.group == 0 ? dp_rank_ : expert_rank_; }
  bool sharded() const { return zero_ >= 1; }
  bool units() const { return zero_ >= 2; }
  std::int64_t shard_numel() const { return shard_numel_; }  // Σ k over buckets
  // The compression's error feedback on this rank (CompressedReduction::
  // export_errors); empty without 1bit error feedback.
  Result<std::vector<float>> export_errors();
  Status import_errors(std::span<const float> errors);
  std::int64_t error_numel() const { return compression_ ? compression_->error_numel() : 0; }
  // The reduced gradient shards of this rank (sharded only), valid after finish().
  const Tensor& shard_grads() const { return shard_grads_; }

 private:
  void issue(std::size_t i);
  void reduce_range(std::size_t i);
  // `last`: no later micro-batch adds to the unit this step.
  void reduce_unit(std::size_t i, bool last);
  void reduced(std::size_t i);  // bucket i's last reduction of the step is issued

  Backend& b_;
  ParameterStore& params_;
  Group dp_, expert_data_;
  int dp_rank_, expert_rank_;
  int zero_;
  Stream compute_, comm_;
  std::vector<Bucket> buckets_;
  std::vector<bool> issued_;
  std::vector<Tensor> unit_grads_;  // (n_pad) by bucket, while bound (unit layout)
  bool armed_ = false;
  std::int64_t shard_numel_ = 0;
  Tensor shard_grads_;  // (Σ k) sharded only
  BucketCompression compression_options_;
  UnitReduce unit_reduce_;
  std::unique_ptr<CompressedReduction> compression_;  // null without compression
  bool compress_ = false;                             // this step's reductions are compressed
  bool overlap_ = false;                              // overlap_updates() was called
  std::function<void(std::size_t)> on_reduced_;
  std::vector<bool> reduced_;  // by bucket: on_reduced_ called this step
  Event zeroed_;               // overlapped: the step's gradient zeroing on the communication stream
};

}  // namespace meshtrain
