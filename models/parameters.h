// The parameter table: every parameter tensor of a model, with its full shape
// and how tensor, expert and pipeline parallelism place it. Parameter counts,
// per-rank shards, FLOPs and the model's own allocation all derive from it.
//
// Weights of linear layers are stored (in, out) so that y = x · W. Tensor
// parallelism splits a column-parallel weight along `out` (dim 1) and a
// row-parallel one along `in` (dim 0), Megatron style. A fused weight (QKV,
// SwiGLU's gate|up) has `segments` along the split dimension; each segment is
// split evenly and a rank's shard is the concatenation of its pieces, so the
// shard of [q | k | v] is [q_r | k_r | v_r].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"

namespace meshtrain {

enum class TpSplit { replicated, column, row, vocab };

struct ParamInfo {
  std::string name;                // "layers.3.attn.qkv.weight"
  int layer = 0;                   // -1: embeddings; 0..L-1: transformer layers; L: final norm and head
  std::vector<std::int64_t> shape; // full, unsharded (an expert weight is (E, in, out))
  TpSplit split = TpSplit::replicated;
  int split_dim = 0;                       // dimension that tp splits (of the per-expert matrix for experts)
  std::vector<std::int64_t> segments;      // sizes along split_dim; one entry if not fused
  bool matmul = false;                     // a GEMM weight applied to every (routed) token
  bool weight_decay = false;               // matrices decay; norms, biases and embeddings do not
  bool expert = false;                     // dim 0 indexes experts; expert parallelism splits it

  std::int64_t numel() const;
};

// Every parameter in model order: embeddings, layers, final norm, untied head.
std::vector<ParamInfo> parameter_table(const ModelSpec& m);

// Vocabulary rows held in total when the embedding is split over tp ranks:
// padded up to a multiple of tp so every shard is equal (Megatron pads too).
std::int64_t padded_vocab(const ModelSpec& m, int tp);

// Where pipeline parallelism puts a layer: stage and model chunk, for pp
// stages with vpp chunks each. Virtual stage c·pp + s (chunk c of stage s)
// holds layers [vs·L/(pp·vpp), (vs+1)·L/(pp·vpp)); the embeddings (layer -1)
// live on virtual stage 0 and the final norm and head (layer L) on the last.
struct StagePlacement {
  int stage = 0;
  int chunk = 0;
};
StagePlacement place_layer(const ModelSpec& m, int layer, int pp, int vpp);

// Elements of `p` held by one rank of a (tp, ep) split; replicated
// parameters are held whole. Vocab-split tensors count padded rows.
std::int64_t shard_numel(const ModelSpec& m, const ParamInfo& p, int tp, int ep);

// A rank's position in the (tp, ep) split of a parameter.
struct ShardCoord {
  int tp_rank = 0, tp = 1;
  int ep_rank = 0, ep = 1;
};

// The shape of a rank's shard of `p` (vocab-split dimensions padded).
std::vector<std::int64_t> shard_shape(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c);

// Flat index into the full tensor of element `local` (flat, row-major) of the
// rank's shard; -1 for the padding rows of a vocab-split tensor. Every
// element of the full tensor is held by exactly one tp rank of an ep shard,
// or by every rank if replicated: init, gather and checkpoints all use this.
std::int64_t full_index(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c, std::int64_t local);

struct ParamCount {
  std::int64_t total = 0;      // every parameter once (tied embeddings once)
  std::int64_t embedding = 0;  // token and position embeddings (and an untied head)
  std::int64_t non_embedding() const { return total - embedding; }
};
ParamCount count_parameters(const ModelSpec& m);

// Parameters held by the rank at pipeline stage `stage` of a (tp, pp, vpp, ep)
// plan: its layers' shards, plus the embedding on the first stage and the head
// on the last. With tied embeddings and pp > 1 the last stage keeps its own
// copy of the embedding for the head, as Megatron does.
struct ShardCount {
  std::int64_t total = 0;
  std::int64_t embedding = 0;
};
ShardCount count_shard_parameters(const ModelSpec& m, int tp, int pp, int vpp, int ep, int stage);

}  // namespace meshtrain
