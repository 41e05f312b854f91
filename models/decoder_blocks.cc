#include "models/decoder_blocks.h"

#include <vector>

#include "models/block_context.h"
#include "models/vocab_shard.h"

namespace meshtrain {

namespace {

class TokenEmbedding : public Block {
 public:
  TokenEmbedding(const ModelSpec& m, BlockContext& ctx)
      : m_(m), ctx_(ctx), vocab_rows_(padded_vocab(m, ctx.tp.size) / ctx.tp.size) {}

  Tensor forward(const MicroBatch& mb, const Tensor&, std::unique_ptr<Block::Saved>*) override {
    Backend& b = ctx_.b;
    const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq, R = ctx_.local_rows(N);
    Tensor x = b.empty(Shape{N, m_.hidden}, ctx_.act);
    b.embedding_forward(ctx_.params["embed.tokens"].value, mb.ids, x, ctx_.tp.rank * vocab_rows_);
    // Each tp rank looked up only the tokens of its vocabulary shard: sum them (its sequence shard under SP).
    if (ctx_.sp) x = ctx_.sp_scatter(x);
    else ctx_.tp_all_reduce(x);
    if (m_.position == PositionKind::learned) {
      Tensor pe = b.empty(Shape{R, m_.hidden}, ctx_.act);
      const Tensor& all = ctx_.positions(mb.batch, mb.seq);
      const Tensor ids = ctx_.sp ? all.slice(ctx_.tp.rank * R, R) : all;
      b.embedding_forward(ctx_.params["embed.positions"].value, ids, pe, 0);
      b.add(x, pe, x);
    }
    if (ctx_.options.dropout > 0) b.dropout_forward(x, x, ctx_.dropout(mb, -1, 0, R, m_.hidden));
    return x;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved&, const Tensor& dx_in, float) override {
    Backend& b = ctx_.b;
    const std::int64_t R = ctx_.local_rows(static_cast<std::int64_t>(mb.batch) * mb.seq);
    Tensor dx = dx_in;
    if (ctx_.options.dropout > 0) {
      dx = b.empty(dx_in.shape(), ctx_.act);
      b.dropout_backward(dx_in, dx, ctx_.dropout(mb, -1, 0, R, m_.hidden));
    }
    // Every token's gradient reaches the vocabulary shard that owns it, and every position's row.
    if (ctx_.sp) dx = ctx_.sp_gather(dx.view(Shape{R, m_.hidden}));
    Tensor dtokens = ctx_.params["embed.tokens"].grad;
    b.embedding_backward(dx, mb.ids, dtokens, ctx_.tp.rank * vocab_rows_);
    if (m_.position == PositionKind::learned) {
      Tensor dpos = ctx_.params["embed.positions"].grad;
      b.embedding_backward(dx, ctx_.positions(mb.batch, mb.seq), dpos, 0);
    }
    return Tensor();
  }

 private:
  const ModelSpec& m_;
  BlockContext& ctx_;
  std::int64_t vocab_rows_;  // V on this rank (padded shard)
};

class LmHead : public Block {
 public:
  LmHead(const ModelSpec& m, BlockContext& ctx) : m_(m), ctx_(ctx), vocab_(m, ctx) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x, std::unique_ptr<Block::Saved>* saved) override {
    const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq;
    auto s = std::make_unique<Saved>();
    s->x = x.view(Shape{ctx_.local_rows(N), m_.hidden});
    ctx_.norm_forward("final_norm", s->x, s->nf, s->meanf, s->rstdf);
    // The vocabulary-parallel projection reads every row: gathered under SP (and again in backward).
    const Tensor nf = ctx_.sp ? ctx_.sp_gather(s->nf) : s->nf;
    const bool tied = m_.tied_embeddings;
    Tensor loss_sum = vocab_.forward(mb, nf, N, ctx_.params[tied ? "embed.tokens" : "head"].value, tied, s->logits,
                                     s->row_max, s->sumexp);
    if (saved) *saved = std::move(s);
    return loss_sum;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor&, float loss_scale) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq;
    Tensor dlogits = vocab_.logits_grad(mb, s.logits, s.row_max, s.sumexp, loss_scale);
    s.logits = Tensor();  // the largest activation: free it before the next allocations
    Tensor dnf = b.empty(Shape{N, m_.hidden}, ctx_.act);
    const Tensor nf = ctx_.sp ? ctx_.sp_gather(s.nf) : s.nf;
    if (m_.tied_embeddings) {
      const ParamSlot& w = ctx_.params["embed.tokens"];
      b.gemm(dlogits, w.value, dnf, GemmOp{});
      Tensor dw = w.grad;
      b.gemm(dlogits, nf, dw, GemmOp{true, false, 1.f, 1.f});
    } else {
      vocab_.untied_backward(ctx_.params["head"], nf, dlogits, dnf);
    }
    // The head is column-parallel over the vocabulary: its input gradient sums the shards' parts.
    if (ctx_.sp) dnf = ctx_.sp_scatter(dnf);
    else ctx_.tp_all_reduce(dnf);
    Tensor dx;
    ctx_.norm_backward("final_norm", dnf, s.x, s.meanf, s.rstdf, dx);
    return dx;
  }

 private:
  struct Saved : Block::Saved {
    Tensor x, nf, meanf, rstdf, logits, row_max, sumexp;
  };

  const ModelSpec& m_;
  BlockContext& ctx_;
  VocabShard vocab_;
};

}  // namespace

std::vector<ParamInfo> TokenEmbeddingDef::parameters() const {
  ParamTableBuilder t(layer());
  t.add("embed.tokens", {m_.vocab, m_.hidden}, TpSplit::vocab, 0);
  if (m_.position == PositionKind::learned) t.add("embed.positions", {m_.seq_len, m_.hidden});
  return t.take();
}

std::unique_ptr<Block> TokenEmbeddingDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<TokenEmbedding>(ctx.m, ctx);
}

std::vector<ParamInfo> LmHeadDef::parameters() const {
  ParamTableBuilder t(layer());
  t.norm("final_norm", m_.hidden, m_.norm);
  if (!m_.tied_embeddings) t.add("head", {m_.hidden, m_.vocab}, TpSplit::vocab, 1, {}, true, true);
  return t.take();
}

std::vector<std::string> LmHeadDef::borrowed() const {
  if (m_.tied_embeddings) return {"embed.tokens"};
  return {};
}

ForwardFlops LmHeadDef::flops(double samples, std::int64_t seq) const {
  // The projection to the vocabulary, tied or not: 2·tokens·C·V.
  ForwardFlops f;
  f.head = 2.0 * samples * static_cast<double>(seq) * m_.hidden * static_cast<double>(m_.vocab);
  return f;
}

double LmHeadDef::activation_bytes(const ActivationQuery& q) const {
  const double rows = q.micro_batch * q.seq, h = m_.hidden, t = q.tp;
  const double rep = q.sequence_parallel ? t : 1.0;
  const ActivationLayout& a = q.layout;
  double bytes = a.value_bytes * (2.0 * rows * h / rep + rows * static_cast<double>(padded_vocab(m_, q.tp)) / t);
  if (a.row_stats) {
    const double norms = m_.norm == NormKind::layernorm ? 2.0 : 1.0;
    bytes += 4.0 * (norms * rows / rep + 2.0 * rows);  // norm statistics; row max and sum of exp
  }
  return bytes;
}

double LmHeadDef::backward_working_bytes(const ActivationQuery& q) const {
  return q.layout.value_bytes * q.micro_batch * q.seq * static_cast<double>(padded_vocab(m_, q.tp)) / q.tp;
}

std::unique_ptr<Block> LmHeadDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<LmHead>(ctx.m, ctx);
}

}  // namespace meshtrain
