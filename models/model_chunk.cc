#include "models/model_chunk.h"

#include <algorithm>
#include <iterator>

namespace meshtrain {

struct ChunkActivations {
  std::vector<std::unique_ptr<Block::Saved>> blocks;  // by position in the chunk
  std::vector<Tensor> inputs;                         // a recomputed block's input
};
void ChunkActivationsDeleter::operator()(ChunkActivations* a) const { delete a; }

namespace {

// Blocks [begin, end) of the model's list for `layers` (hook index h is block h + 1).
std::pair<std::size_t, std::size_t> block_range(const ModelSpec& m, const ChunkLayers& c) {
  const std::size_t begin = c.embedding ? 0 : static_cast<std::size_t>(c.first + 1);
  const std::size_t end = c.head ? static_cast<std::size_t>(m.layers + 2) : static_cast<std::size_t>(c.last + 1);
  return {begin, end};
}

std::vector<ParamInfo> chunk_parameters(const ModelBlocks& defs, std::size_t begin, std::size_t end) {
  std::vector<ParamInfo> own, borrowed;
  for (std::size_t i = begin; i < end; ++i) {
    std::vector<ParamInfo> p = defs[i]->parameters();
    std::move(p.begin(), p.end(), std::back_inserter(own));
  }
  for (std::size_t i = begin; i < end; ++i)
    for (const std::string& name : defs[i]->borrowed()) {
      const bool held = std::any_of(own.begin(), own.end(), [&](const ParamInfo& p) { return p.name == name; }) ||
                        std::any_of(borrowed.begin(), borrowed.end(), [&](const ParamInfo& p) { return p.name == name; });
      if (held) continue;
      // A copy of the owner's parameter (a tied head on a chunk without the embedding).
      for (std::size_t j = 0; j < begin; ++j)
        for (ParamInfo& p : defs[j]->parameters())
          if (p.name == name) borrowed.push_back(std::move(p));
    }
  // Model order: what is borrowed belongs to earlier blocks.
  borrowed.insert(borrowed.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
  return borrowed;
}

}  // namespace

ModelChunk::ModelChunk(Backend& b, const ModelSpec& m, ChunkLayers layers, TensorParallel tp, ChunkOptions options)
    : b_(b),
      m_(m),
      defs_(model_blocks(m_)),
      begin_(block_range(m_, layers).first),
      end_(block_range(m_, layers).second),
      layers_(layers),
      params_(b, m_, chunk_parameters(defs_, begin_, end_),
              ShardCoord{tp.rank, tp.size, options.expert.rank, options.expert.size, options.expert.tensor_rank,
                         options.expert.tensor_size},
              options.storage),
      ctx_(b, m_, params_, std::move(tp), options) {
  for (std::size_t i = begin_; i < end_; ++i) blocks_.push_back(defs_[i]->instantiate(ctx_));
}

ModelChunk::~ModelChunk() = default;

Shape ModelChunk::boundary_shape(int batch, int seq, bool output) const {
  const BlockIo io = defs_[output ? end_ - 1 : begin_]->io(seq);
  const std::int64_t rows = static_cast<std::int64_t>(batch) * (output ? io.tokens_out : io.tokens_in);
  return Shape{ctx_.local_rows(rows), output ? io.width_out : io.width_in};
}

Tensor ModelChunk::forward(const MicroBatch& mb, const Tensor& input, SavedActivations& saved) {
  return forward_phased(mb, input, saved).run();
}

Tensor ModelChunk::backward(const MicroBatch& mb, SavedActivations& saved, const Tensor& dout, float loss_scale) {
  return backward_phased(mb, saved, dout, loss_scale).run();
}

Phased<Tensor> ModelChunk::forward_phased(const MicroBatch& mb, Tensor input, SavedActivations& saved) {
  saved.reset(new ChunkActivations);
  saved->blocks.resize(blocks_.size());
  saved->inputs.resize(blocks_.size());
  const bool recompute = ctx_.options.recompute == Recompute::full;
  Tensor h = input;
  for (std::size_t k = 0; k < blocks_.size(); ++k) {
    const BlockDef& def = *defs_[begin_ + k];
    const bool body = def.layer() >= 0 && def.layer() < m_.layers;
    if (hooks_.before_forward) hooks_.before_forward(def.layer());
    if (recompute && body) {
      saved->inputs[k] = h;  // only the block's input; backward runs its forward again
      h = blocks_[k]->forward(mb, h, nullptr);
    } else {
      Phased<Tensor> block = blocks_[k]->forward_phased(mb, h, &saved->blocks[k]);
      while (block.resume()) co_yield Pause{};
      h = block.result();
    }
    if (hooks_.after_forward) hooks_.after_forward(def.layer());
  }
  co_return h;
}

Phased<Tensor> ModelChunk::backward_phased(const MicroBatch& mb, SavedActivations& saved, Tensor dout,
                                           float loss_scale) {
  Tensor g = dout;
  for (std::size_t k = blocks_.size(); k-- > 0;) {
    const BlockDef& def = *defs_[begin_ + k];
    const bool body = def.layer() >= 0 && def.layer() < m_.layers;
    if (hooks_.before_backward) hooks_.before_backward(def.layer());
    std::unique_ptr<Block::Saved>& s = saved->blocks[k];
    // Full recomputation: the block's forward again, just before its backward
    // and so after `dout` arrived, as Megatron-LM's checkpointed layers run it
    // inside autograd's backward (one block's activations alive at a time).
    if (saved->inputs[k].defined()) blocks_[k]->forward(mb, saved->inputs[k], &s);
    if (!s) s = std::make_unique<Block::Saved>();  // a block that keeps nothing
    Phased<Tensor> block = blocks_[k]->backward_phased(mb, *s, g, loss_scale);
    while (block.resume()) co_yield Pause{};
    g = block.result();
    // A body block's activations go before its hook (which may reduce and free
    // gradients); the ends' after theirs.
    if (body) {
      s.reset();
      saved->inputs[k] = Tensor();
    }
    if (hooks_.after_backward) hooks_.after_backward(def.layer());
    s.reset();
  }
  saved.reset();
  co_return g;
}

}  // namespace meshtrain
