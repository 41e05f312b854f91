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
#include <string_view>
#include <vector>

#include "core/status.h"
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

// Every parameter in model order: the blocks' parameters (models/block.h),
// first block to last (for a decoder: embeddings, layers, final norm, untied head).
std::vector<ParamInfo> parameter_table(const ModelSpec& m);

// Builds a block's entries of the table.
class ParamTableBuilder {
 public:
  explicit ParamTableBuilder(int layer) : layer_(layer) {}
  // One tensor; `segments` default to the whole split dimension.
  void add(std::string name, std::vector<std::int64_t> shape, TpSplit split = TpSplit::replicated, int split_dim = 0,
           std::vector<std::int64_t> segments = {}, bool matmul = false, bool decay = false, bool expert = false);
  // A linear layer (in -> out), its weight split as `split`; the bias (when
  // `bias`) of a column-parallel layer is split with it, that of a
  // row-parallel or replicated one is not.
  void linear(const std::string& name, std::int64_t in, std::int64_t out, TpSplit split, bool bias,
              std::vector<std::int64_t> segments = {});
  // A norm's weight (and a LayerNorm's bias) over `width`.
  void norm(const std::string& name, std::int64_t width, NormKind kind);
  std::vector<ParamInfo> take() { return std::move(params_); }

 private:
  int layer_;
  std::vector<ParamInfo> params_;
};

// Vocabulary rows held in total when the embedding is split over tp ranks:
// padded up to a multiple of tp so every shard is equal (Megatron pads too).
std::int64_t padded_vocab(const ModelSpec& m, int tp);

// How pipeline parallelism splits the layers: pp stages of vpp chunks each.
// By default every stage holds L/pp layers. As in Megatron-Core
// (--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers),
// the first and the last stage may hold a given number instead (Llama 3 405B
// runs 126 layers on 16 stages with 7 on each end, Dubey et al. 2024, Sec.
// 3.3.2, since the ends also hold the embedding and the head); 0 means "an
// even share", and the stages without a given number share the remaining
// layers evenly. Each stage splits its layers evenly over its vpp chunks.
// Virtual stage c·pp + s (chunk c of stage s) holds the next layers in
// virtual-stage order: virtual stage 0 holds layers [0, n0), 1 the next n1...
//
// A plan's segment (engine/plan/plan.h) splits only its window of the model:
// body layers [first_layer, first_layer + layers), with the embedding on its
// virtual stage 0 only when it holds the model's first block and the head on
// its last only when it holds the last; the defaults are the whole model.
//
// Interleaved chunks need not be equal (Megatron-Core's flexible layouts):
//  * `chunk_layers` gives the body layers of every virtual stage (pp·vpp
//    numbers in virtual-stage order, summing to the window's layers; 0 for a
//    chunk that holds only the embedding or only the head);
//  * `embedding_in_split` / `loss_in_split` (Megatron-Core's
//    --account-for-embedding-in-pipeline-split and
//    --account-for-loss-in-pipeline-split) count the embedding, and the
//    final norm with the head and loss, as one layer each, and split L + 1
//    (+ 1) evenly over the virtual stages: virtual stage 0 then holds one
//    body layer fewer (none when each virtual stage takes one: the
//    embedding alone, as Llama 3 405B's 126 + 2 = 128 layers over 16 stages
//    of 8 chunks), and the last one likewise.
// Either replaces first/last_stage_layers and the even split.
struct StageSplit {
  int pp = 1, vpp = 1;
  int first_stage_layers = 0, last_stage_layers = 0;  // 0: an even share
  int first_layer = 0, layers = -1;                   // -1: to the model's end
  bool embedding = true, head = true;
  std::vector<int> chunk_layers{};  // empty: derived from the fields above
  bool embedding_in_split = false, loss_in_split = false;

  int layer_count(const ModelSpec& m) const { return layers < 0 ? m.layers - first_layer : layers; }
  int end_layer(const ModelSpec& m) const { return first_layer + layer_count(m); }
  // Whether the window holds parameters of hook index `layer` (-1 embedding, L head).
  bool holds(const ModelSpec& m, int layer) const {
    return layer < 0 ? embedding : layer >= m.layers ? head : layer >= first_layer && layer < end_layer(m);
  }
};
// Body layers of every virtual stage, in virtual-stage order (chunk c of
// stage s is virtual stage c·pp + s). Assumes a split that divides
// (check_stage_split).
std::vector<int> virtual_stage_layer_counts(const ModelSpec& m, const StageSplit& s);
// Layers of pipeline stage `stage` (all its chunks together). Assumes a split
// that divides (check_stage_split).
int stage_layer_count(const ModelSpec& m, const StageSplit& s, int stage);
// The error names the numbers when the layers do not split this way.
Status check_stage_split(const ModelSpec& m, const StageSplit& s);

struct LayerRange {
  int begin = 0, end = 0;  // [begin, end)
};
// The layers of every virtual stage, in virtual-stage order, back to back
// from the split's first layer (for callers that visit many of them: one
// pass over the counts, not one per stage).
std::vector<LayerRange> virtual_stage_ranges(const ModelSpec& m, const StageSplit& s);
// The layers of virtual stage `virtual_stage` (chunk c of stage s is c·pp + s).
LayerRange virtual_stage_layers(const ModelSpec& m, const StageSplit& s, int virtual_stage);

// Where a layer lives: its stage and model chunk. The embeddings (layer -1)
// live on virtual stage 0 and the final norm and head (layer L) on the last.
struct StagePlacement {
  int stage = 0;
  int chunk = 0;
};
StagePlacement place_layer(const ModelSpec& m, int layer, const StageSplit& s);
// The even split (first/last stage layers 0).
StagePlacement place_layer(const ModelSpec& m, int layer, int pp, int vpp);

// Elements of `p` held by one rank of a (tp, ep) split (expert matrices
// split over etp instead of tp; etp 0: as tp); replicated parameters are held
// whole. Vocab-split tensors count padded rows.
std::int64_t shard_numel(const ModelSpec& m, const ParamInfo& p, int tp, int ep, int etp = 0);

// A rank's position in the (tp, ep) split of a parameter.
struct ShardCoord {
  int tp_rank = 0, tp = 1;
  int ep_rank = 0, ep = 1;
  // How expert tensor parallelism splits an expert's matrices; etp 0: as tp.
  int etp_rank = 0, etp = 0;
};

// The shape of a rank's shard of `p` (vocab-split dimensions padded).
std::vector<std::int64_t> shard_shape(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c);

// Flat index into the full tensor of element `local` (flat, row-major) of the
// rank's shard; -1 for the padding rows of a vocab-split tensor. Every
// element of the full tensor is held by exactly one tp rank of an ep shard,
// or by every rank if replicated: init, gather and checkpoints all use this.
std::int64_t full_index(const ModelSpec& m, const ParamInfo& p, const ShardCoord& c, std::int64_t local);

// The suffix of a linear layer's weight ("layers.0.attn.qkv.weight").
inline constexpr std::string_view kWeightSuffix = ".weight";
// Whether `p` is the weight of a linear layer whose GEMMs run in FP8 under
// precision fp8 (models/fp8_linear.h): a tensor-parallel (column or row)
// matrix; not a bias, a norm, an embedding, the head or a router.
bool is_fp8_linear(const ParamInfo& p);

struct ParamCount {
  std::int64_t total = 0;      // every parameter once (tied embeddings once)
  std::int64_t embedding = 0;  // token and position embeddings (and an untied head)
  // Parameters a token uses: all but the experts, and top_k of each MoE
  // layer's experts (total for a dense model).
  std::int64_t active = 0;
  std::int64_t expert = 0;  // expert matrices (every expert)
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
  std::int64_t expert = 0;  // of which expert matrices (replicated over the expert-data group only)
  // Of which weights of linears whose GEMMs run in FP8 under precision fp8
  // (is_fp8_linear), and of those the experts'.
  std::int64_t fp8_linear = 0;
  std::int64_t fp8_linear_expert = 0;
};
ShardCount count_shard_parameters(const ModelSpec& m, int tp, const StageSplit& split, int ep, int stage,
                                  int etp = 0);
// The even split (first/last stage layers 0).
ShardCount count_shard_parameters(const ModelSpec& m, int tp, int pp, int vpp, int ep, int stage);

}  // namespace meshtrain
