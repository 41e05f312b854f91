#include "engine/parallel/sharded_optimizer.h"

#include <algorithm>

namespace meshtrain {

ShardedAdamW::ShardedAdamW(Backend& b, ParameterStore& params, const GradientBuckets& buckets, Stream comm)
    : b_(b), params_(params), buckets_(buckets), comm_(comm) {
  const Shape shape{buckets.sharded() ? buckets.shard_numel() : params.numel()};
  m_ = b.empty(shape);
  v_ = b.empty(shape);
  b.fill(m_, 0.f);
  b.fill(v_, 0.f);
}

void ShardedAdamW::for_each_piece(
    const std::function<void(const ParamSlot&, std::int64_t, std::int64_t, std::int64_t)>& f) {
  if (!buckets_.sharded()) {
    for (const ParamSlot& s : params_.slots()) f(s, s.offset, s.value.numel(), s.offset);
    return;
  }
  const int r = buckets_.dp_rank();
  for (const Bucket& k : buckets_.buckets()) {
    const std::int64_t lo = k.owned_begin(r), hi = lo + k.owned_size(r);
    for (const ParamSlot& s : params_.slots()) {
      const std::int64_t a = std::max(lo, s.offset), e = std::min(hi, s.offset + s.value.numel());
      if (a < e) f(s, a, e - a, k.state_offset + (a - lo));
    }
  }
}

void ShardedAdamW::accumulate_sumsq(Tensor& out, const std::function<bool(const ParamSlot&)>& counts) {
  const Tensor& grads = buckets_.sharded() ? buckets_.shard_grads() : params_.grads();
  for_each_piece([&](const ParamSlot& s, std::int64_t, std::int64_t n, std::int64_t local) {
    if (counts(s)) b_.sum_squares(grads.slice(local, n), out, true);
  });
}

void ShardedAdamW::update(const AdamWOp& base, float weight_decay, const Tensor& coef) {
  const Tensor& grads = buckets_.sharded() ? buckets_.shard_grads() : params_.grads();
  for_each_piece([&](const ParamSlot& s, std::int64_t flat, std::int64_t n, std::int64_t local) {
    AdamWOp op = base;
    op.weight_decay = s.info.weight_decay ? weight_decay : 0.f;
    Tensor p = params_.values().slice(flat, n), m = m_.slice(local, n), v = v_.slice(local, n);
    b_.adamw(p, grads.slice(local, n), m, v, coef, op);
  });
  if (!buckets_.sharded() || buckets_.group().size() == 1) return;
  // Every replica needs the whole chunk for the next forward.
  b_.wait(comm_, b_.record(b_.current_stream()));
  const Stream compute = b_.current_stream();
  {
    StreamScope on_comm(b_, comm_);
    const int r = buckets_.dp_rank(), G = buckets_.group().size();
    for (const Bucket& k : buckets_.buckets()) {
      Tensor mine = b_.empty(Shape{k.shard});
      if (k.owned_size(r) < k.shard) b_.fill(mine, 0.f);
      if (k.owned_size(r) > 0) {
        Tensor head = mine.slice(0, k.owned_size(r));
        b_.copy(params_.values().slice(k.owned_begin(r), k.owned_size(r)), head);
      }
      Tensor whole = params_.values().slice(k.begin, k.size);
      if (k.shard * G == k.size) {
        b_.all_gather(mine, whole, buckets_.group());
      } else {
        Tensor staging = b_.empty(Shape{k.shard * G});
        b_.all_gather(mine, staging, buckets_.group());
        b_.copy(staging.slice(0, k.size), whole);
      }
    }
  }
  b_.wait(compute, b_.record(comm_));
}

Status ShardedAdamW::gather_moments(std::vector<float>& m, std::vector<float>& v) {
  const auto n = static_cast<std::size_t>(params_.numel());
  if (!buckets_.sharded()) {
    m.resize(n);
    v.resize(n);
    MT_TRY(b_.read(m_, m));
    return b_.read(v_, v);
  }
  const int G = buckets_.group().size();
  std::vector<float> gm(static_cast<std::size_t>(buckets_.shard_numel()) * G), gv(gm.size());
  Tensor all_m = b_.empty(Shape{buckets_.shard_numel() * G}), all_v = b_.empty(all_m.shape());
  b_.all_gather(m_, all_m, buckets_.group());
  b_.all_gather(v_, all_v, buckets_.group());
  MT_TRY(b_.read(all_m, gm));
  MT_TRY(b_.read(all_v, gv));
  m.assign(n, 0.f);
  v.assign(n, 0.f);
  // Rank q's block holds its shard of every bucket, at the bucket's state offset.
  for (int q = 0; q < G; ++q)
    for (const Bucket& k : buckets_.buckets()) {
      const std::size_t from = static_cast<std::size_t>(q * buckets_.shard_numel() + k.state_offset);
      const auto to = static_cast<std::size_t>(k.owned_begin(q));
      for (std::int64_t i = 0; i < k.owned_size(q); ++i) {
        m[to + i] = gm[from + i];
        v[to + i] = gv[from + i];
      }
    }
  return ok_status();
}

void ShardedAdamW::load_moments(const std::vector<float>& m, const std::vector<float>& v) {
  if (!buckets_.sharded()) {
    b_.write(m_, m);
    b_.write(v_, v);
    return;
  }
  std::vector<float> sm(static_cast<std::size_t>(buckets_.shard_numel()), 0.f), sv(sm.size(), 0.f);
  const int r = buckets_.dp_rank();
  for (const Bucket& k : buckets_.buckets())
    for (std::int64_t i = 0; i < k.owned_size(r); ++i) {
      sm[static_cast<std::size_t>(k.state_offset + i)] = m[static_cast<std::size_t>(k.owned_begin(r) + i)];
      sv[static_cast<std::size_t>(k.state_offset + i)] = v[static_cast<std::size_t>(k.owned_begin(r) + i)];
    }
  b_.write(m_, sm);
  b_.write(v_, sv);
}

}  // namespace meshtrain
