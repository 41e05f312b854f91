#include "engine/parallel/sharded_optimizer.h"

#include <algorithm>
#include <cassert>

namespace meshtrain {

ShardedAdamW::ShardedAdamW(Backend& b, ParameterStore& params, const GradientBuckets& buckets,
                           ParameterGather* gather, Stream comm, Offload offload, OffloadStreams streams)
    : b_(b), params_(params), buckets_(buckets), gather_(gather), comm_(comm), offload_(offload), streams_(streams) {
  const Shape shape{buckets.sharded() ? buckets.shard_numel() : params.numel()};
  const bool host = offload != Offload::none;
  m_ = host ? b.host_zeros(shape) : b.zeros(shape);
  v_ = host ? b.host_zeros(shape) : b.zeros(shape);
  if (host) host_grads_ = b.host_zeros(shape);
  pieces_ = bucket_pieces();
  if (host) {
    const std::vector<Bucket>& all = buckets.buckets();
    for (const std::vector<Piece>& bucket : pieces_) {
      std::size_t last = reach_.size();
      for (const Piece& p : bucket)
        while (last + 1 < all.size() && all[last + 1].begin < p.flat + p.n) ++last;
      reach_.push_back(last);
    }
    reduced_.assign(pieces_.size(), false);
    sent_.assign(pieces_.size(), false);
    landed_.resize(pieces_.size());
  }
  // Offloaded parameters are their own fp32 master (parameter_gather.h); offloaded optimizer state keeps one.
  if (offload == Offload::optimizer || (offload == Offload::none && params.value_dtype() != DType::f32)) {
    master_ = host ? b.host_zeros(shape) : b.empty(shape);
    // The working copy holds the initial values: the master starts from them (exact for
    // the 16-bit values themselves; an import loads fp32 values over both). Offloaded, the
    // copy runs on the copy stream, under the first forward, and the first update waits for it.
    const Stream issuing = b.current_stream();
    if (host) b.wait(streams_.down, b.record(issuing));
    StreamScope on(b, host ? streams_.down : issuing);
    for_each_piece([&](const ParamSlot&, std::int64_t flat, std::int64_t n, std::int64_t local) {
      Tensor dst = master_.slice(local, n);
      const Tensor src = working(flat, local, n);
      if (host) {
        copy_across(src, dst);
      } else {
        b_.cast(src, dst);
      }
    });
    if (host) master_ready_ = b.record(streams_.down);
  }
}

bool ShardedAdamW::sharded_master() const { return buckets_.sharded() && (master_.defined() || gather_); }

void ShardedAdamW::for_each_piece(
    const std::function<void(const ParamSlot&, std::int64_t, std::int64_t, std::int64_t)>& f) {
  if (!buckets_.sharded()) {
    for (const ParamSlot& s : params_.slots()) f(s, s.offset, s.numel, s.offset);
    return;
  }
  for (const Bucket& k : buckets_.buckets()) {
    const int r = buckets_.rank_in(k);
    const std::int64_t lo = k.owned_begin(r), hi = lo + k.owned_size(r);
    // Only the slots overlapping [lo, hi): every slot for every bucket was O(layers²) per rank.
    const std::vector<ParamSlot>& slots = params_.slots();
    for (std::size_t i = params_.first_slot_ending_after(lo); i < slots.size() && slots[i].offset < hi; ++i) {
      const ParamSlot& s = slots[i];
      const std::int64_t a = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
      if (a < e) f(s, a, e - a, k.state_offset + (a - lo));
    }
  }
}

std::vector<std::vector<ShardedAdamW::Piece>> ShardedAdamW::bucket_pieces() {
  const std::vector<ParamSlot>& slots = params_.slots();
  std::vector<std::vector<Piece>> out(buckets_.buckets().size());
  std::size_t k = 0;
  for_each_piece([&](const ParamSlot& s, std::int64_t flat, std::int64_t n, std::int64_t local) {
    // Pieces come in flat order: the bucket holding this one's first element is k or a later one.
    while (k + 1 < out.size() && buckets_.buckets()[k + 1].begin <= flat) ++k;
    out[k].push_back({static_cast<std::size_t>(&s - slots.data()), flat, n, local});
  });
  return out;
}

Tensor ShardedAdamW::working(std::int64_t flat, std::int64_t local, std::int64_t n) {
  if (gather_) return gather_->shards().slice(local, n);
  return params_.values().slice(flat, n);
}

Tensor ShardedAdamW::master(std::int64_t flat, std::int64_t local, std::int64_t n) {
  if (master_.defined()) return master_.slice(local, n);
  return working(flat, local, n);
}

void ShardedAdamW::accumulate_sumsq(Tensor& out, const std::function<bool(const ParamSlot&)>& counts) {
  const Tensor& grads = buckets_.sharded() ? buckets_.shard_grads() : params_.grads();
  for (const std::vector<Piece>& bucket : pieces_) {
    std::vector<Tensor> xs;
    for (const Piece& p : bucket)
      if (counts(params_.slots()[p.slot])) xs.push_back(grads.slice(p.local, p.n));
    if (!xs.empty()) b_.foreach_sum_squares(xs, out);
  }
}

void ShardedAdamW::begin_step() {
  std::fill(reduced_.begin(), reduced_.end(), false);
  std::fill(sent_.begin(), sent_.end(), false);
  copy_order_.clear();
}

void ShardedAdamW::offload_reduced(std::size_t i) {
  reduced_[i] = true;
  const Tensor& grads = buckets_.sharded() ? buckets_.shard_grads() : params_.grads();
  bool after = false;  // streams_.down waits for the reduction
  // Bucket k's pieces are final once it and every bucket they reach into are reduced.
  for (std::size_t k = 0; k <= i; ++k) {
    if (sent_[k] || reach_[k] < i) continue;
    const auto first = reduced_.begin() + static_cast<std::ptrdiff_t>(k);
    if (!std::all_of(first, first + static_cast<std::ptrdiff_t>(reach_[k] - k + 1), [](bool r) { return r; }))
      continue;
    sent_[k] = true;
    copy_order_.push_back(k);
    if (pieces_[k].empty()) continue;
    if (!after) b_.wait(streams_.down, b_.record(comm_));
    after = true;
    StreamScope down(b_, streams_.down);
    for (const Piece& p : pieces_[k]) {
      Tensor dst = host_grads_.slice(p.local, p.n);
      copy_across(grads.slice(p.local, p.n), dst);  // 16-bit gradients (GradDtype::bf16) widen to the host's fp32
    }
    landed_[k] = b_.record(streams_.down);
  }
}

void ShardedAdamW::update_on_host(const AdamWOp& base, const WeightDecay& decay, const Tensor& coef) {
  // GradientBuckets::finish reported every bucket's reduction, so every copy is issued.
  assert(copy_order_.size() == pieces_.size());
  const Stream compute = b_.current_stream();
  {
    StreamScope host(b_, streams_.host);
    // The clip coefficient was computed on the compute stream.
    b_.wait(streams_.host, b_.record(compute));
    if (master_ready_.valid()) b_.wait(streams_.host, master_ready_);
    for (std::size_t k : copy_order_) {
      const std::vector<Piece>& bucket = pieces_[k];
      if (bucket.empty()) continue;
      b_.wait(streams_.host, landed_[k]);
      b_.foreach_adamw(adamw_group(bucket, host_grads_, decay), coef, base);
      if (!master_.defined()) continue;  // offloaded parameters: the master is what the gathers fetch
      b_.wait(streams_.up, b_.record(streams_.host));
      StreamScope up(b_, streams_.up);
      for (const Piece& p : bucket) {
        Tensor w = working(p.flat, p.local, p.n);
        copy_across(master_.slice(p.local, p.n), w);
      }
    }
  }
  b_.wait(compute, b_.record(streams_.host));
  if (master_.defined()) b_.wait(compute, b_.record(streams_.up));
}

void ShardedAdamW::copy_across(const Tensor& src, Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    b_.copy(src, dst);
    return;
  }
  Tensor wide = b_.empty(Shape{src.numel()});
  if (src.dtype() == DType::f32) {  // the fp32 side is the host's: bring it over, then narrow
    b_.copy(src, wide);
    b_.cast(wide, dst);
  } else {
    b_.cast(src, wide);
    b_.copy(wide, dst);
  }
}

std::vector<AdamWTensors> ShardedAdamW::adamw_group(const std::vector<Piece>& bucket, const Tensor& grads,
                                                    const WeightDecay& decay) {
  std::vector<AdamWTensors> group;
  for (const Piece& p : bucket) {
    group.push_back({master(p.flat, p.local, p.n), grads.slice(p.local, p.n), m_.slice(p.local, p.n),
                     v_.slice(p.local, p.n), decay_rate(params_.slots()[p.slot].info, decay)});
  }
  return group;
}

void ShardedAdamW::update_bucket(std::size_t i, const AdamWOp& base, const WeightDecay& decay, const Tensor& coef) {
  const Tensor& grads = buckets_.sharded() ? buckets_.shard_grads() : params_.grads();
  const std::vector<Piece>& bucket = pieces_[i];
  if (!bucket.empty()) b_.foreach_adamw(adamw_group(bucket, grads, decay), coef, base);
  if (!master_.defined()) return;
  for (const Piece& p : bucket) {
    Tensor w = working(p.flat, p.local, p.n);
    b_.cast(master(p.flat, p.local, p.n), w);
  }
}

bool ShardedAdamW::gathers() const {
  if (!buckets_.sharded() || gather_) return false;
  const auto& all = buckets_.buckets();
  return std::any_of(all.begin(), all.end(), [&](const Bucket& k) { return buckets_.group_of(k).size() > 1; });
}

void ShardedAdamW::gather_bucket(std::size_t i) {
  const Bucket& k = buckets_.buckets()[i];
  const Group& group = buckets_.group_of(k);
  const int r = buckets_.rank_in(k), G = group.size();
  if (G == 1) return;  // the owned range is the whole bucket, updated in place
  const DType dt = params_.value_dtype();
  Tensor mine = b_.empty(Shape{k.shard}, dt);
  if (k.owned_size(r) < k.shard) b_.fill(mine, 0.f);
  if (k.owned_size(r) > 0) {
    Tensor head = mine.slice(0, k.owned_size(r));
    b_.copy(params_.values().slice(k.owned_begin(r), k.owned_size(r)), head);
  }
  Tensor whole = params_.values().slice(k.begin, k.size);
  if (k.shard * G == k.size) {
    buckets_.gather(k, mine, whole);
  } else {
    Tensor staging = b_.empty(Shape{k.shard * G}, dt);
    buckets_.gather(k, mine, staging);
    b_.copy(staging.slice(0, k.size), whole);
  }
}

void ShardedAdamW::update(const AdamWOp& base, const WeightDecay& decay, const Tensor& coef) {
  if (offload_ != Offload::none) {
    update_on_host(base, decay, coef);
  } else {
    for (std::size_t i = 0; i < pieces_.size(); ++i) update_bucket(i, base, decay, coef);
  }
  if (!gathers()) return;
  // Every replica needs the whole chunk for the next forward.
  b_.wait(comm_, b_.record(b_.current_stream()));
  const Stream compute = b_.current_stream();
  {
    StreamScope on_comm(b_, comm_);
    for (std::size_t i = 0; i < buckets_.buckets().size(); ++i) gather_bucket(i);
  }
  b_.wait(compute, b_.record(comm_));
}

Tensor ShardedAdamW::on_device(const Tensor& t) {
  if (offload_ == Offload::none) return t;  // offloaded, every state buffer this gathers is in host memory
  Tensor d = b_.empty(t.shape(), t.dtype());
  b_.copy(t, d);
  return d;
}

Status ShardedAdamW::gather_shards(const Tensor& host_or_device, std::vector<float>& out) {
  const Tensor shards = on_device(host_or_device);
  out.assign(static_cast<std::size_t>(params_.numel()), 0.f);
  const auto& buckets = buckets_.buckets();
  // One all-gather per group (dense buckets over dp, expert buckets over the
  // expert-data group) of the group's buckets' shards, concatenated.
  for (int group : {0, 1}) {
    std::vector<const Bucket*> mine;
    std::int64_t S = 0;
    for (const Bucket& k : buckets)
      if (k.group == group) mine.push_back(&k), S += k.shard;
    if (mine.empty()) continue;
    const Group& g = buckets_.group_of(*mine.front());
    const int G = g.size();
    Tensor part = shards;  // every bucket in one group: the buffer as it is
    if (mine.size() != buckets.size()) {
      part = b_.empty(Shape{S}, shards.dtype());
      std::int64_t at = 0;
      for (const Bucket* k : mine) {
        Tensor dst = part.slice(at, k->shard);
        b_.copy(shards.slice(k->state_offset, k->shard), dst);
        at += k->shard;
      }
    }
    Tensor all = b_.empty(Shape{S * G}, shards.dtype());
    b_.all_gather(part, all, g);
    std::vector<float> host(static_cast<std::size_t>(S * G));
    MT_TRY(b_.read(all, host));
    // Rank q's block holds its shard of every bucket of the group, in bucket order.
    for (int q = 0; q < G; ++q) {
      std::int64_t at = 0;
      for (const Bucket* k : mine) {
        const auto from = static_cast<std::size_t>(q * S + at);
        const auto to = static_cast<std::size_t>(k->owned_begin(q));
        std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(from), k->owned_size(q),
                    out.begin() + static_cast<std::ptrdiff_t>(to));
        at += k->shard;
      }
    }
  }
  return ok_status();
}

std::vector<float> ShardedAdamW::owned_part(const std::vector<float>& full) const {
  std::vector<float> out(static_cast<std::size_t>(buckets_.shard_numel()), 0.f);
  for (const Bucket& k : buckets_.buckets()) {
    const int r = buckets_.rank_in(k);
    std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(k.owned_begin(r)), k.owned_size(r),
                out.begin() + static_cast<std::ptrdiff_t>(k.state_offset));
  }
  return out;
}

Status ShardedAdamW::gather_state(std::vector<float>& values, std::vector<float>& m, std::vector<float>& v) {
  const auto n = static_cast<std::size_t>(params_.numel());
  if (!buckets_.sharded()) {
    values.resize(n);
    m.resize(n);
    v.resize(n);
    MT_TRY(b_.read(master_.defined() ? master_ : params_.values(), values));
    MT_TRY(b_.read(m_, m));
    return b_.read(v_, v);
  }
  if (sharded_master()) {
    MT_TRY(gather_shards(master_.defined() ? master_ : gather_->shards(), values));
  } else {
    values.resize(n);
    MT_TRY(b_.read(params_.values(), values));
  }
  MT_TRY(gather_shards(m_, m));
  return gather_shards(v_, v);
}

void ShardedAdamW::load_state(const std::vector<float>& values, const std::vector<float>& m,
                              const std::vector<float>& v) {
  if (!buckets_.sharded()) {
    if (master_.defined()) b_.write(master_, values);
    b_.write(params_.values(), values);
    b_.write(m_, m);
    b_.write(v_, v);
    return;
  }
  const std::vector<float> mine = owned_part(values);
  if (master_.defined()) b_.write(master_, mine);
  if (gather_) b_.write(gather_->shards(), mine);
  else b_.write(params_.values(), values);
  b_.write(m_, owned_part(m));
  b_.write(v_, owned_part(v));
}

}  // namespace meshtrain
