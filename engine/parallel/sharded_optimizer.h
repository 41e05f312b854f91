// ShardedAdamW: AdamW state and fp32 master weights of one model chunk, whole
// or (ZeRO) sharded over the data-parallel group along the gradient buckets.
//
// Without sharding, m and v are like the flat parameter buffer and every
// replica updates every parameter (identically: the gradients were
// all-reduced). With ZeRO, dp rank r holds m and v only for its owned range of
// each bucket (gradient_buckets.h) and updates only those parameters from its
// reduced gradient shard. ZeRO 1 and 2 then all-gather each bucket's
// parameters over the group, so every replica holds the whole updated chunk
// again; ZeRO 3 keeps only the shard (parameter_gather.h gathers it when a
// layer needs it).
//
// The master weights AdamW updates are fp32. When the parameter store holds
// fp32 values they are the master (its flat buffer, or the ZeRO-3 shards).
// Under mixed precision the store holds the 16-bit working copy that GEMMs
// read, and this object keeps the fp32 master (whole or this rank's shard,
// as Megatron's distributed optimizer does); each step updates the master and
// casts it into the working copy, which ZeRO 1/2 then all-gather in 16 bits.
//
// Offloaded (Plan::offload, ZeRO-Offload): m, v and an fp32 master live in
// host memory (Backend::host_zeros), whatever the precision; under
// `params` the master is the ZeRO-3 shards themselves, which parameter_gather.h
// keeps on the host. As soon as a bucket's last reduction of the step is
// issued (during backward: GradientBuckets' on_reduced listener calls
// offload_reduced), its reduced gradients are copied to a host staging
// buffer on one stream (`OffloadStreams::down`), after the reduction, so the
// copies overlap the rest of backward, as ZeRO-Offload streams them. The
// update, on another stream (`host`), waits for the clip coefficient: the
// global norm needs every gradient, so it is computed as without offload, on
// the device, from the reduced gradients still there (they stay resident; the
// norm's fp32 summation order, and so the bits, are those without offload).
// Then it runs each bucket's AdamW on the host's cores, in the order the
// copies landed, and a third stream (`up`) copies the bucket's master back
// into the device's working copy (16 bits: through an fp32 device buffer and
// a cast) once its update is done, so bucket k's copy back overlaps bucket
// k + 1's update. The compute stream waits for the last of both. The host
// update is the cpu backend's kernel on the same values: the bits are those
// of the update on the device.
#pragma once

#include <functional>
#include <vector>

#include "backends/backend.h"
#include "engine/parallel/gradient_buckets.h"
#include "engine/parallel/parameter_gather.h"
#include "engine/parallel/weight_decay.h"
#include "engine/plan/plan.h"
#include "models/parameter_store.h"

namespace meshtrain {

// The streams of an offloaded step: gradient copies to the host, host updates, and the values' copies back.
struct OffloadStreams {
  Stream down, host, up;
};

class ShardedAdamW {
 public:
  // `gather` is the chunk's ZeRO-3 parameter shards, null below stage 3;
  // `offload` params needs it (its shards on the host).
  ShardedAdamW(Backend& b, ParameterStore& params, const GradientBuckets& buckets, ParameterGather* gather,
               Stream comm, Offload offload = Offload::none, OffloadStreams streams = {});

  // out (1) += Σ g² over the reduced gradients this rank holds (its shards, or
  // everything), for the parameters where `counts(slot)` is true, so that a
  // sum over the right groups counts every parameter element once. One
  // foreach_sum_squares per gradient bucket, over its pieces in flat order.
  void accumulate_sumsq(Tensor& out, const std::function<bool(const ParamSlot&)>& counts);
  // Offloaded: a new step's gradients are coming (forget the last step's copies).
  void begin_step();
  // Offloaded: bucket i's last reduction of the step has just been issued on
  // the communication stream. Copies to the host, after it, the gradients of
  // every bucket whose pieces are all reduced now (ZeRO 0: a slot's piece may
  // run into the following buckets, which backward reduces first).
  void offload_reduced(std::size_t i);
  // One AdamW step with the clip coefficient `coef` (undefined: none), one
  // foreach_adamw per gradient bucket; each slot decays at decay_rate(info, decay). Then refreshes the working copy and (ZeRO 1/2)
  // all-gathers the parameters.
  void update(const AdamWOp& op, const WeightDecay& decay, const Tensor& coef);
  // The same for gradient bucket i alone, on the current stream: its AdamW
  // step and working-copy refresh (update_bucket), then, if gathers(), its
  // all-gather over the group (gather_bucket). update() is every bucket's
  // update_bucket, then every gather_bucket on the communication stream.
  // Not with offload (the plan refuses --overlap-update with it): update()
  // then runs the host update.
  void update_bucket(std::size_t i, const AdamWOp& op, const WeightDecay& decay, const Tensor& coef);
  void gather_bucket(std::size_t i);
  // Whether the update ends in all-gathers (ZeRO 1/2 over groups of more than one rank).
  bool gathers() const;

  // The master values and the moments for every element of the chunk's flat
  // buffer (gathered over the group when sharded: collective). BLOCKS.
  Status gather_state(std::vector<float>& values, std::vector<float>& m, std::vector<float>& v);
  // Loads values and moments given for the whole flat buffer; keeps this
  // rank's part (and its working copy).
  void load_state(const std::vector<float>& values, const std::vector<float>& m, const std::vector<float>& v);

 private:
  // Calls f(slot, flat offset, count, index into the rank's grad/state buffers)
  // for each piece of a slot that this rank updates.
  void for_each_piece(const std::function<void(const ParamSlot&, std::int64_t, std::int64_t, std::int64_t)>& f);
  // The same pieces in the same order, grouped by bucket: sharded, a bucket's
  // owned range cut at slots; else whole slots, each with the bucket it starts in.
  struct Piece {
    std::size_t slot;
    std::int64_t flat, n, local;
  };
  std::vector<std::vector<Piece>> bucket_pieces();
  // The fp32 master of a piece, and the working copy it refreshes (the same when fp32).
  Tensor master(std::int64_t flat, std::int64_t local, std::int64_t n);
  Tensor working(std::int64_t flat, std::int64_t local, std::int64_t n);
  // Whole-buffer host copy of a sharded (Σ k) buffer, gathered over the group.
  Status gather_shards(const Tensor& shards, std::vector<float>& out);
  // This rank's (Σ k) part of a whole-buffer host vector.
  std::vector<float> owned_part(const std::vector<float>& full) const;
  // Whether the master is sharded like m and v (else it is the store's whole flat buffer).
  bool sharded_master() const;
  // One foreach_adamw's tensors: the bucket's pieces of the master, `grads`, m and v.
  std::vector<AdamWTensors> adamw_group(const std::vector<Piece>& bucket, const Tensor& grads,
                                        const WeightDecay& decay);
  // dst = src between host and device memory, one of them fp32: a copy moves
  // bytes without converting, so a 16-bit side is cast through an fp32 device
  // staging tensor.
  void copy_across(const Tensor& src, Tensor& dst);
  // update() with the state in host memory.
  void update_on_host(const AdamWOp& op, const WeightDecay& decay, const Tensor& coef);
  // `t` itself, or a device copy when it is in host memory (a collective's input).
  Tensor on_device(const Tensor& t);

  Backend& b_;
  ParameterStore& params_;
  const GradientBuckets& buckets_;
  ParameterGather* gather_;
  Stream comm_;
  Tensor m_, v_;     // (numel) or (Σ k) when sharded
  Tensor master_;    // fp32 master under mixed precision or offload, like m_; else undefined
  Offload offload_;
  OffloadStreams streams_;
  Tensor host_grads_;  // offloaded: (like m_) the reduced gradients, copied to the host each step
  Event master_ready_;  // offloaded: the initial master's copy to the host (on streams_.down)
  std::vector<std::vector<Piece>> pieces_;  // bucket_pieces()
  // Offloaded, by bucket: the last bucket its pieces reach into; whether it is
  // reduced this step; the end of its gradients' copy to the host. And the
  // buckets in the order their copies were issued this step.
  std::vector<std::size_t> reach_;
  std::vector<bool> reduced_, sent_;  // sent_: its copy issued this step
  std::vector<Event> landed_;
  std::vector<std::size_t> copy_order_;
};

}  // namespace meshtrain
