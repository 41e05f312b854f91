#include "models/parameter_store.h"

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
  if (storage.persistent_grads) grads_ = b.empty(Shape{numel_});
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

template <class F>
void ParameterStore::for_range(std::int64_t begin, std::int64_t size, const char* what, F f) {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    ParamSlot& s = slots_[i];
    const std::int64_t n = shapes_[i].numel();
    if (s.offset + n <= begin || s.offset >= begin + size) continue;
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
    const std::uint64_t key = mix64(seed) ^ hash_name(name);
    std::vector<float> host(static_cast<std::size_t>(slot.value.numel()));
    for (std::size_t i = 0; i < host.size(); ++i) {
      if (is_bias) host[i] = 0.f;
      else if (is_norm) host[i] = 1.f;
      else {
        const std::int64_t f = full_index(m_, slot.info, coord_, static_cast<std::int64_t>(i));
        host[i] = f < 0 ? 0.f : static_cast<float>(std * normal_at(key, static_cast<std::uint64_t>(f)));
      }
    }
    b_.write(slot.value, host);
  }
  zero_grads();
}

void ParameterStore::zero_grads() {
  if (grads_.defined()) b_.fill(grads_, 0.f);
}

}  // namespace meshtrain
