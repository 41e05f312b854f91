#include "models/flops.h"

#include "models/block.h"

namespace meshtrain {

ForwardFlops forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq) {
  ForwardFlops f;
  for (const auto& block : model_blocks(m)) f += block->flops(static_cast<double>(batch), seq);
  return f;
}

FlopCount training_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq, Recompute r) {
  ForwardFlops f = forward_flops(m, batch, seq);
  FlopCount c;
  c.model = 3.0 * f.total();
  c.hardware = c.model;
  if (r == Recompute::full) c.hardware += f.layers;
  if (r == Recompute::selective) c.hardware += f.attention;
  c.per_token = c.model / (static_cast<double>(batch) * (m.vision() ? 1 : seq));
  return c;
}

}  // namespace meshtrain
