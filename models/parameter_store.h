// ParameterStore: one rank's parameters of one model chunk, laid out in one
// flat buffer with a flat gradient buffer beside it; each parameter is a view
// of both. Flat buffers are what data parallelism reduces in buckets and what
// ZeRO shards, so they are the unit of storage from the start.
//
// By default both flat buffers are allocated for the store's lifetime. ZeRO-2
// and ZeRO-3 hold less: without persistent gradients (ZeRO-2/3) the engine
// binds a range of slots to gradient storage of its own while a backward
// writes them and releases it once reduced; without persistent values
// (ZeRO-3) it binds a range to an all-gathered copy before the layers that
// read it and releases it afterwards. A released slot's tensor is undefined.
// A bound range must cover whole slots.
//
// Values are held in `value_dtype` (the 16-bit working copy under mixed
// precision: GEMMs read it; the fp32 master lives with the optimizer);
// gradients in `grad_dtype`, where micro-batches accumulate: fp32 by default
// (Megatron's main_grad), or the 16-bit working dtype when a plan reduces
// gradients in it (engine/plan/plan.h GradDtype).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "models/parameters.h"

namespace meshtrain {

struct ParamSlot {
  ParamInfo info;            // full shape and split
  Tensor value;              // this rank's shard, a view of the flat (or bound) values
  Tensor grad;               // its gradient, same shape, in the store's grad_dtype
  std::int64_t offset = 0;   // first element in the flat buffers
  std::int64_t numel = 0;    // elements of this rank's shard (also while unbound)
};

// How Backend::init_normal draws rank c's shard of p with the counters of
// the full tensor (full_index): the shard viewed as (rows before the split
// dimension) × (the rest), one run per piece of the split dimension that this
// rank holds, the padding of a vocab split in no run. Key and stddev unset.
NormalInitOp shard_draws(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c);

struct ParameterStorage {
  bool persistent_values = true;
  bool persistent_grads = true;
  DType value_dtype = DType::f32;
  DType grad_dtype = DType::f32;
};

class ParameterStore {
 public:
  // `infos` are the parameters this chunk holds, in model order.
  ParameterStore(Backend& b, const ModelSpec& m, std::vector<ParamInfo> infos, ShardCoord coord,
                 ParameterStorage storage = {});

  // GPT-2 initialisation: weights and embeddings N(0, 0.02), the residual
  // projections (attention output, MLP down) N(0, 0.02/√(2·layers)), norm
  // weights 1, biases 0. Element i of a parameter draws normal_at(key, i)
  // (models/init.h: key from the seed and the name) through
  // Backend::init_normal. Writes the values of every bound slot; the
  // gradients are untouched (they start at zero: allocated with zeros()).
  void initialize(std::uint64_t seed);
  // Zeroes the persistent gradient buffer (nothing without one).
  void zero_grads();

  // Slots whose elements lie in [begin, begin + storage.numel()) view
  // `storage` (element `offset - begin` onwards) from now on.
  void bind_values(std::int64_t begin, const Tensor& storage);
  void bind_grads(std::int64_t begin, const Tensor& storage);
  // Those slots' tensors become undefined (the storage is freed with its last handle).
  void release_values(std::int64_t begin, std::int64_t size);
  void release_grads(std::int64_t begin, std::int64_t size);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  const ParamSlot& operator[](const std::string& name) const;
  // The first slot (index into slots()) whose elements end past flat element
  // `offset`; slots().size() when none does. O(log slots).
  std::size_t first_slot_ending_after(std::int64_t offset) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The persistent flat buffers (undefined when not persistent).
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  std::int64_t numel() const { return numel_; }
  DType value_dtype() const { return storage_.value_dtype; }
  DType grad_dtype() const { return storage_.grad_dtype; }
  const ShardCoord& coord() const { return coord_; }

 private:
  // Calls f(slot) for each slot inside [begin, begin + size); aborts on a slot that straddles it.
  template <class F>
  void for_range(std::int64_t begin, std::int64_t size, const char* what, F f);

  Backend& b_;
  const ModelSpec& m_;
  ShardCoord coord_;
  ParameterStorage storage_;
  std::vector<ParamSlot> slots_;
  std::vector<Shape> shapes_;  // by slot
  std::unordered_map<std::string, std::size_t> index_;
  std::int64_t numel_ = 0;
  Tensor values_;  // (numel) value_dtype, when persistent
  Tensor grads_;   // (numel) grad_dtype, when persistent
};

}  // namespace meshtrain
