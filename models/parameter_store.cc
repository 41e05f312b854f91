#include "models/parameter_store.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "models/init.h"

namespace meshtrain {

ParameterStore::ParameterStore(Backend& b, const ModelSpec& m, std::vector<ParamInfo> infos, ShardCoord coord)
    : b_(b), m_(m), coord_(coord) {
  std::int64_t total = 0;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& info : infos) {
    shapes.push_back(shard_shape(m, info, coord));
    total += Shape(shapes.back()).numel();
  }
  values_ = b.empty(Shape{total});
  grads_ = b.empty(Shape{total});
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    Shape shape(shapes[i]);
    const std::int64_t n = shape.numel();
    index_.emplace(infos[i].name, slots_.size());
    slots_.push_back({std::move(infos[i]), values_.slice(offset, n, shape), grads_.slice(offset, n, shape), offset});
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

void ParameterStore::initialize(std::uint64_t seed) {
  const double residual_std = 0.02 / std::sqrt(2.0 * m_.layers);
  for (auto& slot : slots_) {
    const std::string& name = slot.info.name;
    const bool is_bias = name.ends_with(".bias");
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool residual = name.ends_with("attn.out.weight") || name.ends_with("mlp.down.weight") ||
                          name.ends_with("moe.down");
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

void ParameterStore::zero_grads() { b_.fill(grads_, 0.f); }

}  // namespace meshtrain
