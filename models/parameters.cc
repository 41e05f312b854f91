#include "models/parameters.h"

#include <algorithm>
#include <iterator>

#include "models/block.h"
#include "models/model_tables.h"

namespace meshtrain {

std::int64_t ParamInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void ParamTableBuilder::add(std::string name, std::vector<std::int64_t> shape, TpSplit split, int split_dim,
                            std::vector<std::int64_t> segments, bool matmul, bool decay, bool expert) {
  ParamInfo p;
  p.name = std::move(name);
  p.layer = layer_;
  p.shape = std::move(shape);
  p.split = split;
  p.split_dim = split_dim;
  const std::size_t d = static_cast<std::size_t>(split_dim + (expert ? 1 : 0));
  p.segments = segments.empty() ? std::vector<std::int64_t>{p.shape[d]} : std::move(segments);
  p.matmul = matmul;
  p.weight_decay = decay;
  p.expert = expert;
  params_.push_back(std::move(p));
}

void ParamTableBuilder::linear(const std::string& name, std::int64_t in, std::int64_t out, TpSplit split, bool bias,
                               std::vector<std::int64_t> segments) {
  const bool column = split == TpSplit::column;
  add(name + ".weight", {in, out}, split, column ? 1 : 0, segments, true, true);
  if (bias) add(name + ".bias", {out}, column ? TpSplit::column : TpSplit::replicated, 0, column ? segments : std::vector<std::int64_t>{});
}

void ParamTableBuilder::norm(const std::string& name, std::int64_t width, NormKind kind) {
  add(name + ".weight", {width});
  if (kind == NormKind::layernorm) add(name + ".bias", {width});
}

std::vector<ParamInfo> parameter_table(const ModelSpec& m) {
  std::vector<ParamInfo> out;
  for (const auto& block : model_blocks(m)) {
    std::vector<ParamInfo> p = block->parameters();
    std::move(p.begin(), p.end(), std::back_inserter(out));
  }
  return out;
}

std::int64_t padded_vocab(const ModelSpec& m, int tp) {
  return (static_cast<std::int64_t>(m.vocab) + tp - 1) / tp * tp;
}

namespace {

// Megatron-Core's shortcuts: the embedding and the loss as layers of the split.
int split_units(const ModelSpec& m, const StageSplit& s) {
  return s.layer_count(m) + (s.embedding_in_split && s.embedding ? 1 : 0) + (s.loss_in_split && s.head ? 1 : 0);
}

Status check_flexible_split(const ModelSpec& m, const StageSplit& s) {
  const int L = s.layer_count(m), V = s.pp * s.vpp;
  if (s.first_stage_layers > 0 || s.last_stage_layers > 0)
    return make_error("first_stage_layers / last_stage_layers and chunk_layers or the embedding/loss accounting "
                      "both describe the split; give one of them");
  if (!s.chunk_layers.empty()) {
    if (s.embedding_in_split || s.loss_in_split)
      return make_error("chunk_layers gives every chunk's layers; leave out account_for_embedding_in_pipeline_split "
                        "and account_for_loss_in_pipeline_split (put 0 layers in the first or last chunk instead)");
    if (static_cast<int>(s.chunk_layers.size()) != V)
      return make_error("chunk_layers has {} entries; pp·vpp = {}·{} = {} virtual stages need one each",
                        s.chunk_layers.size(), s.pp, s.vpp, V);
    int sum = 0;
    for (std::size_t vs = 0; vs < s.chunk_layers.size(); ++vs) {
      const int n = s.chunk_layers[vs];
      if (n < 0) return make_error("chunk_layers[{}] is {}; a chunk holds 0 or more layers", vs, n);
      const bool ends = (vs == 0 && s.embedding) || (static_cast<int>(vs) == V - 1 && s.head);
      if (n == 0 && !ends)
        return make_error("chunk_layers[{}] is 0: only the first chunk (the embedding) or the last (the head and "
                          "loss) may hold no layers", vs);
      sum += n;
    }
    if (sum != L)
      return make_error("chunk_layers add up to {} layers; the model (or segment) has {}", sum, L);
    return ok_status();
  }
  const int units = split_units(m, s);
  if (units % V != 0)
    return make_error("{} layers{}{} = {} are not divisible by pp·vpp = {}·{} = {} virtual stages; choose pp·vpp "
                      "dividing {} or give chunk_layers",
                      L, s.embedding_in_split ? " + the embedding" : "", s.loss_in_split ? " + the loss" : "", units,
                      s.pp, s.vpp, V, units);
  return ok_status();
}

bool flexible(const StageSplit& s) { return !s.chunk_layers.empty() || s.embedding_in_split || s.loss_in_split; }

// A stage's layers under the even split or first/last_stage_layers, before its chunks split them.
int given_stage_layers(const ModelSpec& m, const StageSplit& s, int stage) {
  const int first = s.first_stage_layers, last = s.last_stage_layers, L = s.layer_count(m);
  if (first == 0 && last == 0) return L / s.pp;
  if (stage == 0 && first > 0) return first;
  if (stage == s.pp - 1 && last > 0) return last;
  const int free = s.pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  return free > 0 ? (L - first - last) / free : 0;
}

// place_layer with the split's virtual_stage_ranges given (needed only for
// layers inside its window). A bisection: a deep model's parameters are
// placed for every candidate plan, and vpp grows with the layers.
StagePlacement placement(const ModelSpec& m, int layer, const StageSplit& s, const std::vector<LayerRange>& ranges) {
  int vs = 0;
  if (layer >= s.end_layer(m)) vs = s.pp * s.vpp - 1;
  else if (layer >= s.first_layer)
    vs = static_cast<int>(std::upper_bound(ranges.begin(), ranges.end(), layer,
                                           [](int l, const LayerRange& r) { return l < r.end; }) -
                          ranges.begin());
  return {vs % s.pp, vs / s.pp};
}

}  // namespace

Status check_stage_split(const ModelSpec& m, const StageSplit& s) {
  const int L = s.layer_count(m);
  if (s.first_layer < 0 || L < 0 || s.end_layer(m) > m.layers)
    return make_error("layers [{}, {}) are not within the model's {} layers", s.first_layer, s.end_layer(m), m.layers);
  if (s.pp < 1 || s.vpp < 1) return make_error("pp {} and vpp {} must be positive", s.pp, s.vpp);
  if (flexible(s)) return check_flexible_split(m, s);
  const int first = s.first_stage_layers, last = s.last_stage_layers;
  if (first < 0 || last < 0)
    return make_error("first_stage_layers {} and last_stage_layers {} must be >= 0 (0: an even share)", first,
                      last);
  if (first == 0 && last == 0) {
    if (L % (s.pp * s.vpp) != 0)
      return make_error("layers {} are not divisible by pp·vpp = {}·{} = {}; choose pp·vpp dividing {}, or set "
                        "first_stage_layers / last_stage_layers",
                        L, s.pp, s.vpp, s.pp * s.vpp, L);
    return ok_status();
  }
  if (s.pp < 2)
    return make_error("first_stage_layers {} / last_stage_layers {} need pp >= 2, got pp {}", first, last, s.pp);
  const int fixed = (first > 0 ? 1 : 0) + (last > 0 ? 1 : 0), free = s.pp - fixed;
  const int rest = L - first - last;
  if (rest < free || (free == 0 && rest != 0))
    return make_error("first_stage_layers {} + last_stage_layers {} leave {} of the {} layers for the other {} "
                      "stage(s); each needs at least one, and with pp 2 the two must add up to {}",
                      first, last, rest, L, free, L);
  if (free > 0 && rest % free != 0)
    return make_error("the {} layers left after first_stage_layers {} and last_stage_layers {} do not divide over "
                      "the other {} stages; choose numbers that leave a multiple of {}",
                      rest, first, last, free, free);
  for (int stage = 0; stage < s.pp; ++stage)
    if (given_stage_layers(m, s, stage) % s.vpp != 0)
      return make_error("stage {} holds {} layers, not divisible by vpp {} (each stage splits its layers evenly "
                        "over its chunks; give chunk_layers for uneven chunks)",
                        stage, given_stage_layers(m, s, stage), s.vpp);
  return ok_status();
}

std::vector<int> virtual_stage_layer_counts(const ModelSpec& m, const StageSplit& s) {
  const int V = s.pp * s.vpp;
  if (!s.chunk_layers.empty()) return s.chunk_layers;
  std::vector<int> counts(static_cast<std::size_t>(V));
  if (s.embedding_in_split || s.loss_in_split) {
    const int each = split_units(m, s) / V;
    for (int& n : counts) n = each;
    if (s.embedding_in_split && s.embedding) counts.front() -= 1;
    if (s.loss_in_split && s.head) counts.back() -= 1;
    return counts;
  }
  for (int vs = 0; vs < V; ++vs) counts[static_cast<std::size_t>(vs)] = given_stage_layers(m, s, vs % s.pp) / s.vpp;
  return counts;
}

int stage_layer_count(const ModelSpec& m, const StageSplit& s, int stage) {
  const std::vector<int> counts = virtual_stage_layer_counts(m, s);
  int n = 0;
  for (int c = 0; c < s.vpp; ++c) n += counts[static_cast<std::size_t>(c * s.pp + stage)];
  return n;
}

std::vector<LayerRange> virtual_stage_ranges(const ModelSpec& m, const StageSplit& s) {
  std::vector<LayerRange> ranges;
  int begin = s.first_layer;
  for (int n : virtual_stage_layer_counts(m, s)) {
    ranges.push_back({begin, begin + n});
    begin += n;
  }
  return ranges;
}

LayerRange virtual_stage_layers(const ModelSpec& m, const StageSplit& s, int virtual_stage) {
  return virtual_stage_ranges(m, s)[static_cast<std::size_t>(virtual_stage)];
}

StagePlacement place_layer(const ModelSpec& m, int layer, const StageSplit& s) {
  const bool inside = layer >= s.first_layer && layer < s.end_layer(m);
  return placement(m, layer, s, inside ? virtual_stage_ranges(m, s) : std::vector<LayerRange>{});
}

StagePlacement place_layer(const ModelSpec& m, int layer, int pp, int vpp) {
  return place_layer(m, layer, StageSplit{pp, vpp, 0, 0});
}

std::int64_t shard_numel(const ModelSpec& m, const ParamInfo& p, int tp, int ep, int etp) {
  std::int64_t n = p.numel();
  if (p.expert) n /= ep;
  if (p.expert && etp > 0) tp = etp;
  switch (p.split) {
    case TpSplit::replicated: return n;
    case TpSplit::column:
    case TpSplit::row: return n / tp;
    case TpSplit::vocab: return n / m.vocab * padded_vocab(m, tp) / tp;
  }
  return n;
}

std::vector<std::int64_t> shard_shape(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c) {
  std::vector<std::int64_t> shape = p.shape;
  const std::size_t base = p.expert ? 1 : 0;
  if (p.expert) shape[0] /= c.ep;
  const std::size_t d = base + static_cast<std::size_t>(p.split_dim);
  const int tp = p.expert && c.etp > 0 ? c.etp : c.tp;
  if (p.split == TpSplit::vocab) shape[d] = padded_vocab(m, tp) / tp;
  else if (p.split != TpSplit::replicated) shape[d] /= tp;
  return shape;
}

std::int64_t full_index(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c, std::int64_t local) {
  const std::vector<std::int64_t> shape = shard_shape(m, p, c);
  // Unravel `local` over the shard's shape, map each coordinate, ravel over the full shape.
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    idx[i] = local % shape[i];
    local /= shape[i];
  }
  const std::size_t base = p.expert ? 1 : 0;
  if (p.expert) idx[0] += c.ep_rank * shape[0];
  const std::size_t d = base + static_cast<std::size_t>(p.split_dim);
  const bool expert_split = p.expert && c.etp > 0;
  const int tp = expert_split ? c.etp : c.tp, tp_rank = expert_split ? c.etp_rank : c.tp_rank;
  if (p.split == TpSplit::vocab) {
    idx[d] += tp_rank * shape[d];
    if (idx[d] >= p.shape[d]) return -1;
  } else if (p.split != TpSplit::replicated) {
    // The shard is the concatenation of this rank's piece of every segment.
    std::int64_t j = idx[d], segment_start = 0;
    for (std::int64_t seg : p.segments) {
      const std::int64_t piece = seg / tp;
      if (j < piece) {
        idx[d] = segment_start + tp_rank * piece + j;
        break;
      }
      j -= piece;
      segment_start += seg;
    }
  }
  std::int64_t flat = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) flat = flat * p.shape[i] + idx[i];
  return flat;
}

ParamCount count_parameters(const ModelSpec& m) { return model_tables(m)->count; }

bool is_fp8_linear(const ParamInfo& p) {
  if (!p.matmul || (p.split != TpSplit::column && p.split != TpSplit::row)) return false;
  return p.expert || p.name.ends_with(kWeightSuffix);
}

ShardCount count_shard_parameters(const ModelSpec& m, int tp, const StageSplit& split, int ep, int stage, int etp) {
  ShardCount c;
  // The split's stages once, not once per tensor (the memory model asks for every candidate plan).
  const std::vector<LayerRange> ranges = virtual_stage_ranges(m, split);
  const int head_stage = placement(m, m.layers, split, ranges).stage;
  // How many layers of [begin, end) `stage` holds: the hooks (embeddings -1,
  // head L) where placement puts them, body layers by its virtual stages.
  auto held_here = [&](int begin, int end) -> std::int64_t {
    std::int64_t n = 0;
    for (int hook : {-1, m.layers})
      if (begin <= hook && hook < end && split.holds(m, hook) && placement(m, hook, split, ranges).stage == stage) ++n;
    for (std::size_t vs = static_cast<std::size_t>(stage); vs < ranges.size(); vs += static_cast<std::size_t>(split.pp))
      n += std::max(0, std::min({ranges[vs].end, end, m.layers}) - std::max({ranges[vs].begin, begin, 0}));
    return n;
  };
  const std::shared_ptr<const ModelTables> tables = model_tables(m);
  for (const LayerRun& run : tables->runs) {
    const std::int64_t layers = held_here(run.begin, run.end);
    for (std::size_t i : run.tensors) {
      const ParamInfo& p = tables->parameters[i];
      const bool embedding = p.split == TpSplit::vocab || p.name == "embed.positions";
      const std::int64_t n = shard_numel(m, p, tp, ep, etp);
      c.total += n * layers;
      if (embedding) c.embedding += n * layers;
      if (p.expert) c.expert += n * layers;
      if (is_fp8_linear(p)) {
        c.fp8_linear += n * layers;
        if (p.expert) c.fp8_linear_expert += n * layers;
      }
      // The tied head reuses the token embedding: a separate stage needs a copy.
      if (p.name == "embed.tokens" && m.tied_embeddings && split.holds(m, p.layer) && split.head && split.pp > 1 &&
          head_stage == stage) {
        c.total += n;
        c.embedding += n;
      }
    }
  }
  return c;
}

ShardCount count_shard_parameters(const ModelSpec& m, int tp, int pp, int vpp, int ep, int stage) {
  return count_shard_parameters(m, tp, StageSplit{pp, vpp, 0, 0}, ep, stage);
}

}  // namespace meshtrain
