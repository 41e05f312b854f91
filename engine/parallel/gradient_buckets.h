// GradientBuckets: data-parallel reduction of one model chunk's flat gradient
// buffer in buckets, each issued on the communication stream as soon as the
// last micro-batch's backward has finished every gradient in it (overlap with
// the rest of backward), Megatron/DDP style.
//
// A bucket is a range [begin, begin + n) of the flat buffer. Buckets hold
// about `bucket_elements` each, a multiple of dp, so only the last one needs
// padding (to n_pad = k·dp, k = ceil(n / dp)). Flat buffers are in model
// order (embeddings, layers ascending, final norm and head), so buckets finish
// from the last to the first and are issued in that order on every replica.
//
// Without ZeRO a bucket is all-reduced (summed) in place. With ZeRO (any
// stage) it is reduce-scattered: dp rank r keeps only the summed shard
// [r·k, (r+1)·k) of the padded bucket (its "owned" range, clipped to n), in a
// buffer of its own; the optimizer updates that shard and all-gathers the
// parameters (sharded_optimizer.h).
//
// The gradients are summed, not averaged: the engine scales every token's loss
// by 1 / (tokens of the global batch), so the sum over replicas is the gradient
// of the mean token loss over the global batch.
//
// Deferred buckets (those holding the tied token embedding when pp > 1) are
// issued only by finish(): both pipeline ends' copies must first be summed over
// the embedding group, and that can only happen after the schedule has run.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "models/parameter_store.h"

namespace meshtrain {

struct Bucket {
  std::int64_t begin = 0, size = 0;  // range of the flat buffer
  std::int64_t shard = 0;            // k = ceil(size / dp)
  std::int64_t state_offset = 0;     // first element of this bucket's shard in the rank's shard buffers
  int min_layer = 0;                 // lowest layer with a gradient in the bucket
  bool deferred = false;
  std::int64_t owned_begin(int dp_rank) const;  // flat offset of the owned range
  std::int64_t owned_size(int dp_rank) const;   // its length, <= shard
};

class GradientBuckets {
 public:
  GradientBuckets(Backend& b, ParameterStore& params, Group dp, bool sharded, std::int64_t bucket_elements,
                  bool defer_embedding, Stream compute, Stream comm);

  // Starts an iteration: nothing issued, nothing armed.
  void begin_step();
  // The next backward through this chunk is its last of the iteration: from
  // now on layer hooks issue the buckets they complete.
  void arm() { armed_ = true; }
  // The chunk's backward hook (GptChunk::set_backward_hook).
  void on_layer_done(int layer);
  // Issues every bucket not issued yet (the deferred ones) and makes the
  // compute stream wait for all of them.
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Group& group() const { return dp_; }
  int dp_rank() const { return dp_rank_; }
  bool sharded() const { return sharded_; }
  std::int64_t shard_numel() const { return shard_numel_; }  // Σ k over buckets
  // The reduced gradient shards of this rank (sharded only), valid after finish().
  const Tensor& shard_grads() const { return shard_grads_; }

 private:
  void issue(std::size_t i);

  Backend& b_;
  ParameterStore& params_;
  Group dp_;
  int dp_rank_;
  bool sharded_;
  Stream compute_, comm_;
  std::vector<Bucket> buckets_;
  std::vector<bool> issued_;
  bool armed_ = false;
  std::int64_t shard_numel_ = 0;
  Tensor shard_grads_;  // (Σ k) sharded only
};

}  // namespace meshtrain
