#include "models/model_tables.h"

#include <algorithm>
#include <optional>
#include <tuple>

namespace meshtrain {

namespace {

ParamCount count_of(const ModelSpec& m, const std::vector<ParamInfo>& table) {
  ParamCount c;
  for (const auto& p : table) {
    c.total += p.numel();
    if (p.split == TpSplit::vocab || p.name == "embed.positions") c.embedding += p.numel();
    if (!p.expert) continue;
    c.expert += p.numel();
    c.active -= p.numel() - p.numel() / m.experts * m.top_k;  // a token passes through top_k experts
  }
  c.active += c.total;
  return c;
}

// What count_shard_parameters reads of a tensor (the name only for the embeddings' roles).
auto shard_signature(const ParamInfo& p) {
  return std::make_tuple(p.split, p.expert, p.numel(), p.name == "embed.positions", p.name == "embed.tokens");
}

std::vector<LayerRun> layer_runs(const std::vector<ParamInfo>& table) {
  std::vector<LayerRun> runs;
  std::size_t i = 0;
  while (i < table.size()) {
    // One layer's tensors: table[i, j).
    std::size_t j = i;
    while (j < table.size() && table[j].layer == table[i].layer) ++j;
    const bool extends = !runs.empty() && runs.back().end == table[i].layer &&
                         runs.back().tensors.size() == j - i &&
                         std::equal(runs.back().tensors.begin(), runs.back().tensors.end(), table.begin() + static_cast<std::ptrdiff_t>(i),
                                    [&](std::size_t a, const ParamInfo& b) { return shard_signature(table[a]) == shard_signature(b); });
    if (extends) {
      ++runs.back().end;
    } else {
      LayerRun run{table[i].layer, table[i].layer + 1, {}};
      for (std::size_t k = i; k < j; ++k) run.tensors.push_back(k);
      runs.push_back(std::move(run));
    }
    i = j;
  }
  return runs;
}

// Every field of ModelSpec (a VisionEncoderSpec compares itself). The size check fails to compile when
// a field is added, until it is added here too: a field left out would hand one model another's tables.
bool same_spec(const ModelSpec& a, const ModelSpec& b) {
  static_assert(sizeof(ModelSpec) == 256, "a ModelSpec field was added or removed: update same_spec's list");
  const auto fields = [](const ModelSpec& m) {
    return std::tie(m.name, m.family, m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq_len,
                    m.tied_embeddings, m.bias, m.norm, m.activation, m.position, m.norm_eps, m.rope_theta,
                    m.head_dim_size, m.sliding_window, m.window_pattern, m.attention_sinks, m.experts, m.top_k, m.shared_experts, m.moe_every, m.dense_layers, m.dense_ffn,
                    m.renormalize, m.capacity_factor, m.aux_loss_coeff, m.z_loss_coeff, m.image_size, m.patch,
                    m.channels, m.classes, m.window, m.depths, m.stage_heads, m.vision_encoder, m.projector,
                    m.decoder_layers, m.question_len);
  };
  return fields(a) == fields(b);
}

}  // namespace

std::shared_ptr<const ModelTables> model_tables(const ModelSpec& m) {
  // This thread's last model and its tables.
  thread_local std::optional<ModelSpec> key;
  thread_local std::shared_ptr<const ModelTables> tables;
  if (tables && key && same_spec(*key, m)) return tables;
  auto built = std::make_shared<ModelTables>();
  built->blocks = model_blocks(m);
  built->parameters = parameter_table(m);
  built->count = count_of(m, built->parameters);
  built->runs = layer_runs(built->parameters);
  key = m;
  tables = std::move(built);
  return tables;
}

}  // namespace meshtrain
