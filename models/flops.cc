#include "models/flops.h"

#include "models/parameters.h"

namespace meshtrain {

ForwardFlops forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
  ForwardFlops f;
  for (const auto& p : parameter_table(m)) {
    if (!p.matmul) continue;
    double macs_per_token = static_cast<double>(p.numel());
    // Each token passes through top_k of the experts' matrices.
    if (p.expert) macs_per_token = macs_per_token / m.experts * m.top_k;
    double flops = 2.0 * tokens * macs_per_token;
    if (p.layer >= m.layers) f.head += flops;
    else f.layers += flops;
  }
  if (m.tied_embeddings) f.head += 2.0 * tokens * m.hidden * static_cast<double>(m.vocab);
  // q·kᵀ and p·v: each 2·B·s·s·(H·D) FLOPs per layer.
  const double attention_width = static_cast<double>(m.heads) * m.head_dim();
  f.attention = m.layers * 2.0 * (2.0 * batch * static_cast<double>(seq) * seq * attention_width);
  f.layers += f.attention;
  return f;
}

FlopCount training_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq, Recompute r) {
  ForwardFlops f = forward_flops(m, batch, seq);
  FlopCount c;
  c.model = 3.0 * f.total();
  c.hardware = c.model;
  if (r == Recompute::full) c.hardware += f.layers;
  if (r == Recompute::selective) c.hardware += f.attention;
  c.per_token = c.model / (static_cast<double>(batch) * seq);
  return c;
}

}  // namespace meshtrain
