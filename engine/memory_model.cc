#include "engine/memory_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/schedule/builders.h"
#include "models/parameters.h"

namespace meshtrain {

ActivationLayout korthikanti_layout() { return {2, 1, true, false, 0}; }

ActivationLayout meshtrain_layout(const Plan& p) { return {element_bytes(p.precision), 0, false, true, 4}; }

double layer_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  const double s = p.effective_seq_len(m) / p.cp, b = p.micro_batch, h = m.hidden, t = p.tp;
  const double sbh = s * b * h;
  const double heads = m.heads, rows = s * b;
  // Sequence parallelism splits the otherwise replicated tensors over tp too.
  const double rep = p.sequence_parallel ? t : 1.0;
  if (p.recompute == Recompute::full) return a.value_bytes * sbh / rep;

  const double glu = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double qkv = static_cast<double>(m.heads + 2 * m.kv_heads) * m.head_dim() / h;
  const double split_values = qkv + 1.0 + glu * m.ffn / h + m.ffn / h;
  double bytes = a.value_bytes * (4.0 * sbh / rep + split_values * sbh / t);
  bytes += a.mask_bytes * 2.0 * sbh / rep;
  if (a.materialized_attention && p.recompute != Recompute::selective) {
    const double probs = heads * s * s * b / t;  // a·s²·b = sbh · a·s/h
    bytes += (2.0 * a.value_bytes + a.mask_bytes) * probs;
  }
  if (a.row_stats) {
    const double norms = m.norm == NormKind::layernorm ? 2.0 : 1.0;  // mean and rstd, or rstd
    bytes += 4.0 * (2.0 * norms * rows / rep + heads * rows / t);      // two norms; lse per head
  }
  return bytes;
}

double head_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  const double s = p.effective_seq_len(m) / p.cp, b = p.micro_batch, h = m.hidden, t = p.tp;
  const double rep = p.sequence_parallel ? t : 1.0;
  double bytes = a.value_bytes * (2.0 * s * b * h / rep + s * b * static_cast<double>(padded_vocab(m, p.tp)) / t);
  if (a.row_stats) {
    const double norms = m.norm == NormKind::layernorm ? 2.0 : 1.0;
    bytes += 4.0 * (norms * s * b / rep + 2.0 * s * b);  // norm statistics; row max and sum of exp
  }
  return bytes;
}

double layer_backward_working_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a) {
  const double rows = static_cast<double>(p.effective_seq_len(m) / p.cp) * p.micro_batch, t = p.tp;
  const double glu = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double qkv = static_cast<double>(m.heads + 2 * m.kv_heads) * m.head_dim();
  const double width = (qkv + static_cast<double>(m.heads) * m.head_dim() + (glu + 1.0) * m.ffn) / t + 7.0 * m.hidden;
  return a.value_bytes * rows * width;
}

int inflight_microbatches(const Plan& p, int stage) {
  const int m = p.microbatches();
  switch (p.schedule) {
    case ScheduleKind::gpipe: return m;
    case ScheduleKind::one_f_one_b: return std::min(p.pp - stage, m);
    case ScheduleKind::interleaved:
      return std::min(schedule::interleaved_warmup({p.pp, p.vpp, m}, stage) + 1, m * p.vpp);
  }
  return m;
}

MemoryBreakdown memory_per_rank(const ModelSpec& m, const Plan& p, int stage, const ActivationLayout& a) {
  MemoryBreakdown r;
  const ShardCount shard = count_shard_parameters(m, p.tp, p.stage_split(), p.ep, stage);
  r.parameter_count = shard.total;
  const double n = static_cast<double>(shard.total);
  const bool mixed = p.precision != Precision::fp32;
  const double param_bytes = element_bytes(p.precision);
  const double grad_bytes = a.gradient_bytes > 0 ? a.gradient_bytes : element_bytes(p.precision);
  const double optimizer_bytes = mixed ? 12.0 : 8.0;
  const double dp = p.dp;
  // The stage's chunks share its layers evenly; the stage's count follows the plan's split.
  const double layers_per_chunk = static_cast<double>(stage_layer_count(m, p.stage_split(), stage)) / p.vpp;
  r.parameters = n * param_bytes / (p.zero >= 3 ? dp : 1.0);
  r.gradients = n * grad_bytes / (p.zero >= 2 ? dp : 1.0);
  r.optimizer = n * optimizer_bytes / (p.zero >= 1 ? dp : 1.0);
  if (p.zero >= 2) {
    std::int64_t largest_layer = 0, tied_embedding = 0;
    std::vector<std::int64_t> per_layer(static_cast<std::size_t>(m.layers), 0);
    for (const auto& info : parameter_table(m)) {
      if (info.layer >= 0 && info.layer < m.layers)
        per_layer[static_cast<std::size_t>(info.layer)] += shard_numel(m, info, p.tp, p.ep);
      if (info.name == "embed.tokens" && m.tied_embeddings) tied_embedding = shard_numel(m, info, p.tp, p.ep);
    }
    for (auto v : per_layer) largest_layer = std::max(largest_layer, v);
    // A chunk of one layer has no next layer to prefetch within its pass.
    const double gathered = layers_per_chunk > 1 ? 2.0 : 1.0;
    if (p.zero >= 3) r.zero3_working = static_cast<double>(largest_layer) * (gathered * param_bytes + grad_bytes);
    else r.gradient_working = static_cast<double>(largest_layer) * grad_bytes;
    if (stage == 0 || stage == p.pp - 1) r.gradient_working += static_cast<double>(tied_embedding) * grad_bytes;
  }
  if (p.zero == 1) r.gradient_shard = n * grad_bytes / dp;
  r.inflight = inflight_microbatches(p, stage);
  r.backward_working = layer_backward_working_bytes(m, p, a);
  // Each in-flight unit is one micro-batch through one chunk of layers.
  const double chunks_per_unit = p.schedule == ScheduleKind::interleaved ? 1.0 : p.vpp;
  r.activations = r.inflight * chunks_per_unit * layers_per_chunk * layer_activation_bytes(m, p, a);
  if (stage == p.pp - 1) {
    const int head_inflight = p.schedule == ScheduleKind::gpipe ? p.microbatches() : 1;
    r.activations += head_inflight * head_activation_bytes(m, p, a);
  }
  return r;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

}  // namespace meshtrain
