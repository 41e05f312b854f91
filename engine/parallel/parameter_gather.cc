#include "engine/parallel/parameter_gather.h"

#include <algorithm>
#include <climits>

namespace meshtrain {

ParameterGather::ParameterGather(Backend& b, ParameterStore& params, const GradientBuckets& buckets,
                                 std::vector<int> order, Stream compute, Stream comm, bool host_shards)
    : b_(b), params_(params), buckets_(buckets), order_(std::move(order)), compute_(compute), comm_(comm),
      host_(host_shards) {
  if (host_) {
    shards_ = b.host_zeros(Shape{buckets.shard_numel()});
  } else {
    shards_ = b.empty(Shape{buckets.shard_numel()}, params.value_dtype());
    b.fill(shards_, 0.f);
  }
  units_.resize(buckets.buckets().size());
}

bool ParameterGather::uses(std::size_t i, int layer) const {
  const std::vector<int>& u = buckets_.buckets()[i].uses;
  return std::binary_search(u.begin(), u.end(), layer);
}

int ParameterGather::next(int layer, bool backward) const {
  auto it = std::find(order_.begin(), order_.end(), layer);
  if (it == order_.end()) return INT_MIN;
  if (backward) return it == order_.begin() ? INT_MIN : *(it - 1);
  return it + 1 == order_.end() ? INT_MIN : *(it + 1);
}

void ParameterGather::issue(std::size_t i) {
  const Bucket& k = buckets_.buckets()[i];
  Unit& u = units_[i];
  // The shards were last written on the compute stream (the optimizer step).
  b_.wait(comm_, b_.record(compute_));
  StreamScope on_comm(b_, comm_);
  const DType dt = params_.value_dtype();
  Tensor mine = shards_.slice(k.state_offset, k.shard);
  if (host_) {
    Tensor fetched = b_.empty(Shape{k.shard});
    b_.copy(mine, fetched);
    mine = fetched;
    if (dt != DType::f32) {
      mine = b_.empty(Shape{k.shard}, dt);
      b_.cast(fetched, mine);
    }
  }
  u.full = b_.empty(Shape{k.shard * buckets_.group_of(k).size()}, dt);
  buckets_.gather(k, mine, u.full);
  u.ready = b_.record(comm_);
}

void ParameterGather::set_next_pass(ParameterGather* next, bool backward) {
  next_pass_ = next;
  next_backward_ = backward;
}

void ParameterGather::prefetch(int layer) {
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (uses(i, layer) && !units_[i].full.defined()) issue(i);
}

void ParameterGather::before(int layer, bool backward) {
  const auto& buckets = buckets_.buckets();
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (!uses(i, layer)) continue;
    if (!units_[i].full.defined()) issue(i);
    b_.wait(compute_, units_[i].ready);
    params_.bind_values(buckets[i].begin, units_[i].full.slice(0, buckets[i].size));
  }
  const int n = next(layer, backward);
  if (n != INT_MIN) prefetch(n);
  else if (next_pass_) next_pass_->prefetch(next_pass_->first(next_backward_));
}

void ParameterGather::after(int layer, bool backward) {
  const auto& buckets = buckets_.buckets();
  int n = next(layer, backward);
  // The pass's last layer: what the next pass of this chunk starts with stays gathered.
  if (n == INT_MIN && next_pass_ == this) n = first(next_backward_);
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (!uses(i, layer) || (n != INT_MIN && uses(i, n))) continue;
    params_.release_values(buckets[i].begin, buckets[i].size);
    units_[i] = Unit{};
  }
}

void ParameterGather::initialize(std::uint64_t seed) {
  for (const Bucket& k : buckets_.buckets()) {
    const int r = buckets_.rank_in(k);
    Tensor full = b_.empty(Shape{k.size}, params_.value_dtype());
    params_.bind_values(k.begin, full);
    params_.initialize(seed);
    if (k.owned_size(r) > 0) {
      Tensor mine = shards_.slice(k.state_offset, k.owned_size(r));
      Tensor part = full.slice(k.owned_begin(r) - k.begin, k.owned_size(r));
      if (host_ && part.dtype() != DType::f32) {
        Tensor wide = b_.empty(Shape{part.numel()});
        b_.cast(part, wide);
        part = wide;
      }
      b_.copy(part, mine);
    }
    params_.release_values(k.begin, k.size);
  }
}

}  // namespace meshtrain
