#include "engine/parallel/gradient_buckets.h"

#include <algorithm>

namespace meshtrain {

std::int64_t Bucket::owned_begin(int r) const { return begin + std::min(size, r * shard); }
std::int64_t Bucket::owned_size(int r) const {
  return std::min(size, (r + 1) * shard) - std::min(size, r * shard);
}

GradientBuckets::GradientBuckets(Backend& b, ParameterStore& params, Group dp, bool sharded,
                                 std::int64_t bucket_elements, bool defer_embedding, Stream compute, Stream comm)
    : b_(b),
      params_(params),
      dp_(std::move(dp)),
      dp_rank_(dp_.index_of(b.rank())),
      sharded_(sharded),
      compute_(compute),
      comm_(comm) {
  const std::int64_t G = dp_.size(), total = params.numel();
  const std::int64_t step = std::max<std::int64_t>(G, bucket_elements / G * G);
  for (std::int64_t begin = 0; begin < total; begin += step) {
    Bucket k;
    k.begin = begin;
    k.size = std::min(step, total - begin);
    k.shard = (k.size + G - 1) / G;
    k.state_offset = shard_numel_;
    shard_numel_ += k.shard;
    k.min_layer = 1 << 30;
    for (const ParamSlot& s : params.slots()) {
      if (s.offset >= k.begin + k.size || s.offset + s.value.numel() <= k.begin) continue;
      k.min_layer = std::min(k.min_layer, s.info.layer);
      if (defer_embedding && s.info.name == "embed.tokens") k.deferred = true;
    }
    buckets_.push_back(k);
  }
  issued_.assign(buckets_.size(), false);
  if (sharded_) shard_grads_ = b.empty(Shape{shard_numel_});
}

void GradientBuckets::begin_step() {
  std::fill(issued_.begin(), issued_.end(), false);
  armed_ = false;
}

void GradientBuckets::on_layer_done(int layer) {
  if (!armed_) return;
  for (std::size_t i = buckets_.size(); i-- > 0;)
    if (!issued_[i] && !buckets_[i].deferred && buckets_[i].min_layer >= layer) issue(i);
}

void GradientBuckets::issue(std::size_t i) {
  issued_[i] = true;
  const Bucket& k = buckets_[i];
  // The bucket's gradients were issued on the compute stream: the reduction waits for them there.
  b_.wait(comm_, b_.record(compute_));
  StreamScope on_comm(b_, comm_);
  Tensor grads = params_.grads().slice(k.begin, k.size);
  if (dp_.size() == 1 && !sharded_) return;
  if (!sharded_) {
    b_.all_reduce(grads, dp_, ReduceOp::sum);
    return;
  }
  Tensor out = shard_grads_.slice(k.state_offset, k.shard);
  const std::int64_t padded = k.shard * dp_.size();
  if (padded == k.size) {
    b_.reduce_scatter(grads, out, dp_, ReduceOp::sum);
    return;
  }
  // Only the last bucket is ragged: reduce a zero-padded copy.
  Tensor staging = b_.empty(Shape{padded});
  b_.fill(staging, 0.f);
  Tensor head = staging.slice(0, k.size);
  b_.copy(grads, head);
  b_.reduce_scatter(staging, out, dp_, ReduceOp::sum);
}

void GradientBuckets::finish() {
  for (std::size_t i = buckets_.size(); i-- > 0;)
    if (!issued_[i]) issue(i);
  b_.wait(compute_, b_.record(comm_));
}

}  // namespace meshtrain
