#include "engine/parallel/gradient_buckets.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace meshtrain {

std::int64_t Bucket::owned_begin(int r) const { return begin + std::min(size, r * shard); }
std::int64_t Bucket::owned_size(int r) const {
  return std::min(size, (r + 1) * shard) - std::min(size, r * shard);
}

std::int64_t megatron_bucket_elements(int dp, int pipeline_stage, int model_chunk) {
  if (pipeline_stage > 0 || model_chunk > 0) return std::numeric_limits<std::int64_t>::max() / 2;
  return std::max<std::int64_t>(40'000'000, 1'000'000 * static_cast<std::int64_t>(dp));
}

std::vector<int> parameter_uses(const ModelSpec& m, const ParamInfo& info, bool chunk_has_head) {
  if (info.name != "embed.tokens" || !m.tied_embeddings || !chunk_has_head) return {info.layer};
  // The tied head reads the embedding; on a chunk without the embeddings that is its only use.
  if (info.layer == -1 && m.layers > 0) return {-1, m.layers};
  return {m.layers};
}

GradientBuckets::GradientBuckets(Backend& b, const ModelSpec& m, ParameterStore& params, bool chunk_has_head,
                                 Group dp, int zero, std::int64_t bucket_elements, bool defer_embedding,
                                 Stream compute, Stream comm, Group expert_data, BucketCompression compression,
                                 UnitReduce unit_reduce, bool fp8_params)
    : b_(b),
      params_(params),
      dp_(std::move(dp)),
      expert_data_(std::move(expert_data)),
      dp_rank_(dp_.index_of(b.rank())),
      expert_rank_(expert_data_.index_of(b.rank())),
      zero_(zero),
      compute_(compute),
      comm_(comm),
      compression_options_(compression),
      unit_reduce_(unit_reduce) {
  const std::int64_t total = params.numel();
  auto add_bucket = [&](std::int64_t begin, std::int64_t size, int group) {
    Bucket k;
    k.begin = begin;
    k.size = size;
    k.group = group;
    const std::int64_t G = group_of(k).size();
    k.shard = (size + G - 1) / G;
    k.state_offset = shard_numel_;
    shard_numel_ += k.shard;
    // Only the slots overlapping the bucket: every slot for every bucket was O(layers²) per rank.
    const std::vector<ParamSlot>& slots = params.slots();
    for (std::size_t i = params.first_slot_ending_after(begin); i < slots.size() && slots[i].offset < begin + size; ++i) {
      const ParamSlot& s = slots[i];
      for (int u : parameter_uses(m, s.info, chunk_has_head)) k.uses.push_back(u);
      if (defer_embedding && s.info.name == "embed.tokens") k.deferred = true;
      if (fp8_params && is_fp8_linear(s.info))
        k.fp8_elements += std::min(s.offset + s.numel, begin + size) - std::max(s.offset, begin);
    }
    std::sort(k.uses.begin(), k.uses.end());
    k.uses.erase(std::unique(k.uses.begin(), k.uses.end()), k.uses.end());
    buckets_.push_back(std::move(k));
  };
  if (units()) {
    // Consecutive slots with the same uses form a unit; the deferred embedding stands alone.
    const auto& slots = params.slots();
    std::size_t i = 0;
    while (i < slots.size()) {
      const auto key = [&](const ParamSlot& s) {
        return std::tuple(parameter_uses(m, s.info, chunk_has_head), defer_embedding && s.info.name == "embed.tokens",
                          s.info.expert);
      };
      std::size_t j = i + 1;
      while (j < slots.size() && key(slots[j]) == key(slots[i])) ++j;
      const std::int64_t end = j < slots.size() ? slots[j].offset : total;
      add_bucket(slots[i].offset, end - slots[i].offset, slots[i].info.expert ? 1 : 0);
      i = j;
    }
  } else {
    // Runs of dense and of expert slots, each cut into buckets of about bucket_elements.
    const auto& slots = params.slots();
    std::size_t i = 0;
    while (i < slots.size()) {
      std::size_t j = i + 1;
      while (j < slots.size() && slots[j].info.expert == slots[i].info.expert) ++j;
      const std::int64_t first = slots[i].offset, end = j < slots.size() ? slots[j].offset : total;
      const int group = slots[i].info.expert ? 1 : 0;
      const std::int64_t G = group == 0 ? dp_.size() : expert_data_.size();
      const std::int64_t step = std::max<std::int64_t>(G, bucket_elements / G * G);
      for (std::int64_t begin = first; begin < end; begin += step) add_bucket(begin, std::min(step, end - begin), group);
      i = j;
    }
  }
  issued_.assign(buckets_.size(), false);
  reduced_.assign(buckets_.size(), false);
  unit_grads_.resize(buckets_.size());
  if (sharded()) shard_grads_ = b.empty(Shape{shard_numel_}, params.grad_dtype());
  if (compression.kind != GradCompression::none) {
    compression_ = std::make_unique<CompressedReduction>(b, compression.kind, compression.error_feedback,
                                                         buckets_.size());
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      compression_->reserve(i, buckets_[i].shard, group_of(buckets_[i]).size(), !sharded());
  }
}

void GradientBuckets::overlap_updates(std::function<void(std::size_t)> on_reduced) {
  overlap_ = true;
  on_reduced_ = std::move(on_reduced);
}

void GradientBuckets::begin_step(std::int64_t step) {
  std::fill(issued_.begin(), issued_.end(), false);
  std::fill(reduced_.begin(), reduced_.end(), false);
  armed_ = false;
  compress_ = compression_ && step > compression_options_.warmup;
  if (!overlap_) {
    if (units()) b_.fill(shard_grads_, 0.f);
    return;
  }
  // The previous step's updates may still be reading the gradients on the communication stream.
  StreamScope on_comm(b_, comm_);
  params_.zero_grads();
  if (units()) b_.fill(shard_grads_, 0.f);
  zeroed_ = b_.record(comm_);
}

void GradientBuckets::reduced(std::size_t i) {
  if (reduced_[i]) return;
  reduced_[i] = true;
  if (on_reduced_) on_reduced_(i);
}

void GradientBuckets::before_backward(int layer) {
  if (zeroed_.valid()) {
    b_.wait(compute_, zeroed_);
    zeroed_ = Event{};
  }
  if (!units()) return;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& k = buckets_[i];
    if (k.uses.back() != layer || unit_grads_[i].defined()) continue;
    unit_grads_[i] = b_.empty(Shape{k.shard * group_of(k).size()}, params_.grad_dtype());
    b_.fill(unit_grads_[i], 0.f);
    params_.bind_grads(k.begin, unit_grads_[i].slice(0, k.size));
  }
}

void GradientBuckets::after_backward(int layer) {
  for (std::size_t i = buckets_.size(); i-- > 0;) {
    const Bucket& k = buckets_[i];
    if (k.deferred) continue;
    if (units()) {
      if (k.uses.front() == layer && (armed_ || unit_reduce_ == UnitReduce::per_microbatch)) reduce_unit(i, armed_);
    } else if (armed_ && !issued_[i] && k.uses.front() >= layer) {
      issue(i);
    }
  }
}

void GradientBuckets::reduce_unit(std::size_t i, bool last) {
  const Bucket& k = buckets_[i];
  b_.wait(comm_, b_.record(compute_));
  {
    StreamScope on_comm(b_, comm_);
    // Each micro-batch's sum over replicas is added to the owned shard: this rank keeps only k elements.
    Tensor part = b_.empty(Shape{k.shard}, params_.grad_dtype());
    if (compress_ && group_of(k).size() > 1)
      compression_->reduce_scatter(i, unit_grads_[i], part, k.shard, group_of(k));
    else
      b_.reduce_scatter(unit_grads_[i], part, group_of(k), ReduceOp::sum);
    Tensor mine = shard_grads_.slice(k.state_offset, k.shard);
    b_.add(mine, part, mine);
  }
  params_.release_grads(k.begin, k.size);
  unit_grads_[i] = Tensor();
  if (last) reduced(i);
}

void GradientBuckets::gather(const Bucket& k, const Tensor& in, Tensor& out) const {
  if (k.fp8_elements > 0) b_.all_gather_fp8(in, out, group_of(k), k.fp8_elements);
  else b_.all_gather(in, out, group_of(k));
}

void GradientBuckets::issue(std::size_t i) {
  issued_[i] = true;
  reduce_range(i);
  reduced(i);
}

void GradientBuckets::reduce_range(std::size_t i) {
  const Bucket& k = buckets_[i];
  // The bucket's gradients were issued on the compute stream: the reduction waits for them there.
  b_.wait(comm_, b_.record(compute_));
  StreamScope on_comm(b_, comm_);
  Tensor grads = params_.grads().slice(k.begin, k.size);
  const Group& g = group_of(k);
  if (g.size() == 1 && !sharded()) return;
  if (compress_ && g.size() > 1) {
    if (!sharded()) {
      compression_->all_reduce(i, grads, k.shard, g);
    } else {
      Tensor out = shard_grads_.slice(k.state_offset, k.shard);
      compression_->reduce_scatter(i, grads, out, k.shard, g);
    }
    return;
  }
  if (!sharded()) {
    b_.all_reduce(grads, g, ReduceOp::sum);
    return;
  }
  Tensor out = shard_grads_.slice(k.state_offset, k.shard);
  const std::int64_t padded = k.shard * g.size();
  if (padded == k.size) {
    b_.reduce_scatter(grads, out, g, ReduceOp::sum);
    return;
  }
  // Only the last bucket is ragged: reduce a zero-padded copy.
  Tensor staging = b_.empty(Shape{padded}, params_.grad_dtype());
  b_.fill(staging, 0.f);
  Tensor head = staging.slice(0, k.size);
  b_.copy(grads, head);
  b_.reduce_scatter(staging, out, g, ReduceOp::sum);
}

void GradientBuckets::finish() {
  for (std::size_t i = buckets_.size(); i-- > 0;) {
    if (units()) {
      if (unit_grads_[i].defined()) reduce_unit(i, true);
    } else if (!issued_[i]) {
      issue(i);
    }
  }
  // Units reduced per micro-batch without an armed last backward (zero-bubble schedules) end here.
  for (std::size_t i = buckets_.size(); i-- > 0;) reduced(i);
  if (!overlap_) b_.wait(compute_, b_.record(comm_));
}

Result<std::vector<float>> GradientBuckets::export_errors() {
  if (!compression_) return std::vector<float>();
  return compression_->export_errors();
}

Status GradientBuckets::import_errors(std::span<const float> errors) {
  if (compression_) return compression_->import_errors(errors);
  if (errors.empty()) return ok_status();
  return make_error("the checkpoint holds {} error-feedback values for this rank, which compresses nothing",
                    errors.size());
}

}  // namespace meshtrain
