// ParameterStore: one rank's parameters of one model chunk, in one flat fp32
// buffer with a flat gradient buffer beside it; each parameter is a view of
// both. Flat buffers are what data parallelism reduces in buckets and what
// ZeRO shards, so they are the unit of storage from the start.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "models/parameters.h"

namespace meshtrain {

struct ParamSlot {
  ParamInfo info;            // full shape and split
  Tensor value;              // this rank's shard, a view of the flat buffer
  Tensor grad;               // its gradient, same shape
  std::int64_t offset = 0;   // first element in the flat buffers
};

class ParameterStore {
 public:
  // `infos` are the parameters this chunk holds, in model order.
  ParameterStore(Backend& b, const ModelSpec& m, std::vector<ParamInfo> infos, ShardCoord coord);

  // GPT-2 initialisation: weights and embeddings N(0, 0.02), the residual
  // projections (attention output, MLP down) N(0, 0.02/√(2·layers)), norm
  // weights 1, biases 0. Drawn per element with models/init.h.
  void initialize(std::uint64_t seed);
  void zero_grads();

  const std::vector<ParamSlot>& slots() const { return slots_; }
  const ParamSlot& operator[](const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  std::int64_t numel() const { return values_.numel(); }
  const ShardCoord& coord() const { return coord_; }

 private:
  Backend& b_;
  const ModelSpec& m_;
  ShardCoord coord_;
  std::vector<ParamSlot> slots_;
  std::unordered_map<std::string, std::size_t> index_;
  Tensor values_;  // (numel) fp32
  Tensor grads_;   // (numel) fp32
};

}  // namespace meshtrain
