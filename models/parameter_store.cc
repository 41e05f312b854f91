#include "models/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "models/init.h"

namespace meshtrain {

ParameterStore::ParameterStore(Backend& b, const ModelSpec& m, std::vector<ParamInfo> infos, ShardCoord coord,
                               ParameterStorage storage)
    : b_(b), m_(m), coord_(coord), storage_(storage) {
  for (const auto& info : infos) {
    shapes_.emplace_back(shard_shape(m, info, coord));
    numel_ += shapes_.back().numel();
  }
  if (storage.persistent_values) values_ = b.empty(Shape{numel_}, storage.value_dtype);
  if (storage.persistent_grads) grads_ = b.zeros(Shape{numel_}, storage.grad_dtype);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const std::int64_t n = shapes_[i].numel();
    index_.emplace(infos[i].name, slots_.size());
    ParamSlot slot{std::move(infos[i]), Tensor(), Tensor(), offset, n};
    if (values_.defined()) slot.value = values_.slice(offset, n, shapes_[i]);
    if (grads_.defined()) slot.grad = grads_.slice(offset, n, shapes_[i]);
    slots_.push_back(std::move(slot));
    offset += n;
  }
}

const ParamSlot& ParameterStore::operator[](const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::fprintf(stderr, "meshtrain: no parameter '%s' in this chunk\n", name.c_str());
    std::abort();
  }
  return slots_[it->second];
}

std::size_t ParameterStore::first_slot_ending_after(std::int64_t offset) const {
  // Slots lie in offset order, back to back, so their ends never decrease: bisect.
  const auto it = std::partition_point(slots_.begin(), slots_.end(),
                                       [&](const ParamSlot& s) { return s.offset + s.numel <= offset; });
  return static_cast<std::size_t>(it - slots_.begin());
}

template <class F>
void ParameterStore::for_range(std::int64_t begin, std::int64_t size, const char* what, F f) {
  // The walk stops at the first slot starting at or past the range's end. A
  // scan of every slot made each layer's bind and release O(slots): O(layers²)
  // per micro-batch.
  for (std::size_t i = first_slot_ending_after(begin); i < slots_.size(); ++i) {
    ParamSlot& s = slots_[i];
    const std::int64_t n = s.numel;
    if (s.offset >= begin + size) break;
    if (s.offset < begin || s.offset + n > begin + size) {
      std::fprintf(stderr, "meshtrain: %s [%lld, %lld) cuts parameter '%s'\n", what, static_cast<long long>(begin),
                   static_cast<long long>(begin + size), s.info.name.c_str());
      std::abort();
    }
    f(s, shapes_[i]);
  }
}

void ParameterStore::bind_values(std::int64_t begin, const Tensor& storage) {
  for_range(begin, storage.numel(), "bind_values", [&](ParamSlot& s, const Shape& shape) {
    s.value = storage.slice(s.offset - begin, shape.numel(), shape);
  });
}

void ParameterStore::bind_grads(std::int64_t begin, const Tensor& storage) {
  for_range(begin, storage.numel(), "bind_grads", [&](ParamSlot& s, const Shape& shape) {
    s.grad = storage.slice(s.offset - begin, shape.numel(), shape);
  });
}

void ParameterStore::release_values(std::int64_t begin, std::int64_t size) {
  for_range(begin, size, "release_values", [](ParamSlot& s, const Shape&) { s.value = Tensor(); });
}

void ParameterStore::release_grads(std::int64_t begin, std::int64_t size) {
  for_range(begin, size, "release_grads", [](ParamSlot& s, const Shape&) { s.grad = Tensor(); });
}

void ParameterStore::initialize(std::uint64_t seed) {
  const double residual_std = 0.02 / std::sqrt(2.0 * m_.layers);
  for (auto& slot : slots_) {
    if (!slot.value.defined()) continue;
    const std::string& name = slot.info.name;
    const bool is_bias = name.ends_with(".bias");
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool residual = name.ends_with("attn.out.weight") || name.ends_with("mlp.down.weight") ||
                          name.ends_with("moe.down") || name.ends_with("shared.down.weight");
    const double std = residual ? residual_std : 0.02;
    if (is_bias || is_norm) {
      b_.fill(slot.value, is_bias ? 0.f : 1.f);
      continue;
    }
    NormalInitOp draws = shard_draws(m_, slot.info, coord_);
    draws.key = mix64(seed) ^ hash_name(name);
    draws.stddev = std;
    b_.init_normal(slot.value, draws);
  }
}

NormalInitOp shard_draws(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c) {
  const std::vector<std::int64_t> local = shard_shape(m, p, c);
  NormalInitOp op;
  std::int64_t numel = 1;
  for (auto d : local) numel *= d;
  if (p.split == TpSplit::replicated && !p.expert) {  // the whole tensor, in order
    op.cols = numel;
    op.row_stride = static_cast<std::uint64_t>(numel);
    op.runs.push_back({0, numel, 0});
    return op;
  }
  // An expert's matrices split over expert tensor parallelism when it is given (full_index's rule).
  const bool expert_split = p.expert && c.etp > 0;
  const int tp = expert_split ? c.etp : c.tp, tp_rank = expert_split ? c.etp_rank : c.tp_rank;
  // The split dimension d (an expert tensor's expert dimension when it is not otherwise split).
  const std::size_t d = p.split == TpSplit::replicated ? 0 : (p.expert ? 1 : 0) + static_cast<std::size_t>(p.split_dim);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < d; ++i) outer *= local[i];
  for (std::size_t i = d + 1; i < local.size(); ++i) inner *= local[i];
  op.cols = local[d] * inner;
  op.row_stride = static_cast<std::uint64_t>(p.shape[d] * inner);
  // Only the expert dimension (outermost) differs before d: local row r is full row ep_rank·outer + r.
  const std::int64_t first_row = p.expert && d > 0 ? c.ep_rank * outer : 0;
  auto add = [&](std::int64_t local_begin, std::int64_t len, std::int64_t full_begin) {
    if (len > 0)
      op.runs.push_back({local_begin * inner, len * inner,
                         static_cast<std::uint64_t>(first_row) * op.row_stride + static_cast<std::uint64_t>(full_begin * inner)});
  };
  if (p.split == TpSplit::replicated) {  // an expert tensor's experts
    add(0, local[d], c.ep_rank * local[d]);
  } else if (p.split == TpSplit::vocab) {  // one block, padded past the vocabulary
    const std::int64_t begin = tp_rank * local[d];
    add(0, std::min(local[d], p.shape[d] - begin), begin);
  } else {  // this rank's piece of every segment
    std::int64_t j = 0, segment_start = 0;
    for (std::int64_t segment : p.segments) {
      const std::int64_t piece = segment / tp;
      add(j, piece, segment_start + tp_rank * piece);
      j += piece;
      segment_start += segment;
    }
  }
  return op;
}

void ParameterStore::zero_grads() {
  if (grads_.defined()) b_.fill(grads_, 0.f);
}

}  // namespace meshtrain
