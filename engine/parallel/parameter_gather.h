// ParameterGather: ZeRO-3 parameters of one model chunk, sharded over the
// data-parallel group along the unit buckets of gradient_buckets.h (one per
// layer's parameters), and gathered just in time.
//
// dp rank r keeps only its owned range of every unit (the k elements at the
// unit's state offset of `shards()`, in the store's value dtype). Before the
// chunk's forward or backward enters a layer, the units that layer reads are
// all-gathered into a padded (n_pad) buffer and bound to the parameter store
// (models/parameter_store.h); after it leaves the layer they are released,
// unless the next layer of the same pass reads them too. Entering a layer
// also issues the gather of the next layer's units on the communication
// stream (prefetch), and the compute stream waits for a gather by event only
// when it needs it, so the next layer's gather overlaps this layer's compute.
// A rank so holds at most two gathered layers (the one in use and the next)
// besides its shards (Rajbhandari et al. 2020, stage 3).
//
// Across passes (Plan::prefetch_across_chunks): before each forward or
// backward the engine names the pass that follows it in the rank's action
// order (PipelineExecutor's schedule: another chunk's, or the next
// micro-batch's), and entering the last layer of this pass issues the gather
// of that pass's first layer, so a chunk's first layer overlaps the previous
// chunk's last. When the next pass is this chunk's own, the units its first
// layer reads stay gathered instead of being released and gathered again
// (a last stage's forward then backward through the head). Without a named
// pass (the step's last, an evaluation), the first layer waits for its gather.
//
// Gathers are issued in the same order on every replica (they run the same
// schedule), as collectives must be.
//
// With the shards on the host (Plan::offload params, ZeRO-Infinity's
// parameter offload) they are fp32 whatever the precision: they are the
// optimizer's master (sharded_optimizer.h). A gather then first copies the
// unit's shard to the device on the communication stream, casts it to the
// working dtype there, and all-gathers that: the prefetch hides the copy
// behind the current layer's compute as it hides the all-gather.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "engine/parallel/gradient_buckets.h"
#include "models/parameter_store.h"

namespace meshtrain {

class ParameterGather {
 public:
  // `order`: the chunk's layers in forward order (LayerHooks numbering).
  // `buckets` must use the unit layout and outlive this object.
  ParameterGather(Backend& b, ParameterStore& params, const GradientBuckets& buckets, std::vector<int> order,
                  Stream compute, Stream comm, bool host_shards = false);

  // The chunk's hooks (LayerHooks), for forward (backward = false) and backward.
  void before(int layer, bool backward);
  void after(int layer, bool backward);
  // The pass after the one about to run (see above): `next`'s forward
  // (backward = false) or backward; null: none known.
  void set_next_pass(ParameterGather* next, bool backward);

  // (Σ k) this rank's owned part of every unit; padding elements are zero.
  // In the store's value dtype on the device, or fp32 on the host.
  Tensor& shards() { return shards_; }

  // ParameterStore::initialize through a full temporary copy of each unit in
  // turn, keeping the owned part, so the values equal the unsharded ones.
  void initialize(std::uint64_t seed);

 private:
  struct Unit {
    Tensor full;  // (n_pad) gathered values, while issued
    Event ready;  // the gather's completion on the communication stream
  };
  void issue(std::size_t i);
  // The layer after `layer` in this pass, or none (INT_MIN).
  int next(int layer, bool backward) const;
  // The first layer of a forward (backward = false) or backward pass.
  int first(bool backward) const { return backward ? order_.back() : order_.front(); }
  // Issues the gathers of `layer`'s units not issued yet.
  void prefetch(int layer);
  bool uses(std::size_t i, int layer) const;

  Backend& b_;
  ParameterStore& params_;
  const GradientBuckets& buckets_;
  std::vector<int> order_;
  Stream compute_, comm_;
  bool host_;
  Tensor shards_;
  std::vector<Unit> units_;
  ParameterGather* next_pass_ = nullptr;
  bool next_backward_ = false;
};

}  // namespace meshtrain
