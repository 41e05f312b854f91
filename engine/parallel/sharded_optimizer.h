// ShardedAdamW: AdamW state of one model chunk, whole or (ZeRO) sharded over
// the data-parallel group along the gradient buckets.
//
// Without sharding, m and v are like the flat parameter buffer and every
// replica updates every parameter (identically: the gradients were
// all-reduced). With ZeRO, dp rank r holds m and v only for its owned range of
// each bucket (gradient_buckets.h), updates only those parameters from its
// reduced gradient shard, and then all-gathers each bucket's parameters over
// the group so every replica holds the whole updated chunk again.
#pragma once

#include <functional>
#include <vector>

#include "backends/backend.h"
#include "engine/parallel/gradient_buckets.h"
#include "models/parameter_store.h"

namespace meshtrain {

class ShardedAdamW {
 public:
  ShardedAdamW(Backend& b, ParameterStore& params, const GradientBuckets& buckets, Stream comm);

  // out (1) += Σ g² over the reduced gradients this rank holds (its shards, or
  // everything), for the parameters where `counts(slot)` is true, so that a
  // sum over the right groups counts every parameter element once.
  void accumulate_sumsq(Tensor& out, const std::function<bool(const ParamSlot&)>& counts);
  // One AdamW step with the clip coefficient `coef` (undefined: none); the
  // weight decay applies to slots with info.weight_decay. Sharded: then
  // all-gathers the parameters.
  void update(const AdamWOp& op, float weight_decay, const Tensor& coef);

  // The moments for every element of the chunk's flat buffer (gathered over
  // the group when sharded: collective). BLOCKS.
  Status gather_moments(std::vector<float>& m, std::vector<float>& v);
  // Loads moments given for the whole flat buffer; keeps this rank's part.
  void load_moments(const std::vector<float>& m, const std::vector<float>& v);

 private:
  // Calls f(slot, flat offset, count, index into the rank's grad/state buffers)
  // for each piece of a slot that this rank updates.
  void for_each_piece(const std::function<void(const ParamSlot&, std::int64_t, std::int64_t, std::int64_t)>& f);

  Backend& b_;
  ParameterStore& params_;
  const GradientBuckets& buckets_;
  Stream comm_;
  Tensor m_, v_;  // (numel) or (Σ k) when sharded
};

}  // namespace meshtrain
