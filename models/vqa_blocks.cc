#include "models/vqa_blocks.h"

#include "models/block_context.h"
#include "models/transformer_layer.h"
#include "models/vision_blocks.h"
#include "models/vqa_spec.h"
#include "models/vocab_shard.h"

namespace meshtrain {

std::vector<std::int32_t> joined_order(int batch, int image_tokens, int question_tokens) {
  const int P = image_tokens, Q = question_tokens, T = P + Q;
  std::vector<std::int32_t> order(static_cast<std::size_t>(batch) * T);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < T; ++t)
      order[static_cast<std::size_t>(b * T + t)] = t < P ? b * P + t : batch * P + b * Q + t - P;
  return order;
}

std::vector<std::int32_t> answer_rows(int batch, int tokens) {
  std::vector<std::int32_t> rows(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) rows[static_cast<std::size_t>(b)] = b * tokens + tokens - 1;
  return rows;
}

namespace {

class Projector : public Block {
 public:
  Projector(const ProjectorDef& def, BlockContext& ctx) : def_(def), ctx_(ctx) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x_in, std::unique_ptr<Block::Saved>* saved) override {
    Backend& b = ctx_.b;
    const std::int64_t rows = static_cast<std::int64_t>(mb.batch) * def_.image_tokens();
    const Tensor x = ctx_.all_rows(x_in, def_.in_width());
    auto s = std::make_unique<Saved>();
    // (B·Tv, Cv) -> (B·P, Cv): the patch tokens, without the class token.
    s->in = b.empty(Shape{rows, def_.in_width()}, ctx_.act);
    b.gather_rows(x, index(mb.batch, false), s->in);
    Tensor y;
    ctx_.linear("projector.0", s->in, y, LinearKind::replicated);
    if (def_.mlp()) {
      s->hidden = y;
      s->act = b.empty(y.shape(), ctx_.act);
      b.gelu_forward(s->hidden, s->act);
      ctx_.linear("projector.2", s->act, y, LinearKind::replicated);
    }
    if (saved) *saved = std::move(s);
    return ctx_.sp ? ctx_.local_part(y) : y;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor& dout, float) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    Tensor dy = ctx_.all_rows(dout, def_.out_width());
    if (def_.mlp()) {
      Tensor dact;
      ctx_.linear_backward("projector.2", s.act, dy, &dact, LinearKind::replicated);
      dy = b.empty(s.hidden.shape(), ctx_.act);
      b.gelu_backward(dact, s.hidden, dy);
    }
    Tensor din;
    ctx_.linear_backward("projector.0", s.in, dy, &din, LinearKind::replicated);
    // Back to the encoder's rows; the class tokens' rows get no gradient here.
    const std::int64_t rows = static_cast<std::int64_t>(mb.batch) * (def_.image_tokens() + 1);
    Tensor dx = b.empty(Shape{rows, def_.in_width()}, ctx_.act);
    b.gather_rows(din, index(mb.batch, true), dx);
    return ctx_.sp ? ctx_.local_part(dx) : dx;
  }

 private:
  struct Saved : Block::Saved {
    Tensor in, hidden, act;  // (B·P, Cv) patch tokens; the MLP's (B·P, Cd) pre- and post-GELU
  };
  // (B·P) the encoder row of every patch token, b·Tv + 1 + p; inverse: (B·Tv), -1 on class tokens.
  const Tensor& index(int batch, bool inverse) {
    return ctx_.constant_ids(fmt::format("projector_patches:{}:{}", batch, inverse), [&] {
      const int P = def_.image_tokens(), Tv = P + 1;
      std::vector<std::int32_t> order(static_cast<std::size_t>(batch) * P);
      for (int b = 0; b < batch; ++b)
        for (int p = 0; p < P; ++p) order[static_cast<std::size_t>(b * P + p)] = b * Tv + 1 + p;
      return inverse ? inverse_order(order, static_cast<std::size_t>(batch) * Tv) : order;
    });
  }

  const ProjectorDef& def_;
  BlockContext& ctx_;
};

class QuestionJoiner : public Block {
 public:
  QuestionJoiner(const QuestionJoinerDef& def, BlockContext& ctx)
      : def_(def), m_(def.spec()), ctx_(ctx), vocab_rows_(padded_vocab(m_, ctx.tp.size) / ctx.tp.size) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x_in, std::unique_ptr<Block::Saved>*) override {
    Backend& b = ctx_.b;
    const std::int64_t B = mb.batch, P = vqa_image_tokens(m_), Q = m_.question_len, C = m_.hidden;
    const std::int64_t N = B * (P + Q);
    // [B·P image rows | B·Q question rows] as one source, then each sample's rows in order.
    Tensor src = b.empty(Shape{B * (P + Q), C}, ctx_.act);
    Tensor image = src.rows(0, B * P), question = src.rows(B * P, B * Q);
    b.copy(ctx_.all_rows(x_in, C), image);
    b.embedding_forward(ctx_.params["language.embed.tokens"].value, mb.ids, question, ctx_.tp.rank * vocab_rows_);
    // Each tp rank looked up only the ids of its vocabulary shard: sum them.
    ctx_.tp_all_reduce(question);
    Tensor x = b.empty(Shape{N, C}, ctx_.act);
    b.gather_rows(src, order(mb.batch, false), x);
    if (m_.position == PositionKind::learned) {
      Tensor pe = b.empty(Shape{N, C}, ctx_.act);
      b.embedding_forward(ctx_.params["language.embed.positions"].value, positions(mb.batch), pe, 0);
      b.add(x, pe, x);
    }
    if (ctx_.options.dropout > 0) b.dropout_forward(x, x, ctx_.whole_dropout(mb, def_.layer(), N, C));
    return ctx_.sp ? ctx_.local_part(x) : x;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved&, const Tensor& dout, float) override {
    Backend& b = ctx_.b;
    const std::int64_t B = mb.batch, P = vqa_image_tokens(m_), Q = m_.question_len, C = m_.hidden;
    const std::int64_t N = B * (P + Q);
    Tensor dx = ctx_.all_rows(dout, C);
    if (ctx_.options.dropout > 0) {
      Tensor d = b.empty(Shape{N, C}, ctx_.act);
      b.dropout_backward(dx, d, ctx_.whole_dropout(mb, def_.layer(), N, C));
      dx = d;
    }
    if (m_.position == PositionKind::learned) {
      Tensor dpos = ctx_.params["language.embed.positions"].grad;
      b.embedding_backward(dx, positions(mb.batch), dpos, 0);
    }
    Tensor dsrc = b.empty(Shape{N, C}, ctx_.act);
    b.gather_rows(dx, order(mb.batch, true), dsrc);
    // Every tp rank holds every question row's gradient; each adds those of its vocabulary shard.
    Tensor dtable = ctx_.params["language.embed.tokens"].grad;
    b.embedding_backward(dsrc.rows(B * P, B * Q), mb.ids, dtable, ctx_.tp.rank * vocab_rows_);
    const Tensor dimage = dsrc.rows(0, B * P);
    return ctx_.sp ? ctx_.local_part(dimage) : dimage;
  }

 private:
  const Tensor& order(int batch, bool inverse) {
    return ctx_.constant_ids(fmt::format("joined:{}:{}", batch, inverse), [&] {
      auto o = joined_order(batch, vqa_image_tokens(m_), m_.question_len);
      return inverse ? inverse_order(o) : o;
    });
  }
  const Tensor& positions(int batch) { return ctx_.positions(batch, m_.seq_len); }

  const QuestionJoinerDef& def_;
  const ModelSpec& m_;
  BlockContext& ctx_;
  std::int64_t vocab_rows_;  // V on this rank (padded shard)
};

class AnswerHead : public Block {
 public:
  AnswerHead(const AnswerHeadDef& def, BlockContext& ctx)
      : m_(def.spec()),
        ctx_(ctx),
        vocab_(m_, ctx) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x_in, std::unique_ptr<Block::Saved>* saved) override {
    Backend& b = ctx_.b;
    const std::int64_t B = mb.batch, C = m_.hidden;
    auto s = std::make_unique<Saved>();
    s->answer = b.empty(Shape{B, C}, ctx_.act);
    b.gather_rows(ctx_.all_rows(x_in, C), rows(mb.batch, false), s->answer);
    // Every tp rank normalises the same B rows: the norm is not split.
    ctx_.norm_forward("language.final_norm", s->answer, s->nf, s->mean, s->rstd);
    Tensor loss_sum = vocab_.forward(mb, s->nf, B, ctx_.params["language.head"].value, false, s->logits, s->row_max,
                                     s->sumexp);
    if (saved) *saved = std::move(s);
    return loss_sum;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor&, float loss_scale) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    const std::int64_t B = mb.batch, C = m_.hidden;
    Tensor dlogits = vocab_.logits_grad(mb, s.logits, s.row_max, s.sumexp, loss_scale);
    Tensor dnf = b.empty(Shape{B, C}, ctx_.act);
    vocab_.untied_backward(ctx_.params["language.head"], s.nf, dlogits, dnf);
    // Column-parallel over the vocabulary: the input gradient sums the shards' parts.
    ctx_.tp_all_reduce(dnf);
    Tensor danswer;
    ctx_.norm_backward("language.final_norm", dnf, s.answer, s.mean, s.rstd, danswer, false);
    // Only the answer rows reach the loss; every other row's gradient is zero.
    Tensor dx = b.empty(Shape{B * m_.seq_len, C}, ctx_.act);
    b.gather_rows(danswer, rows(mb.batch, true), dx);
    return ctx_.sp ? ctx_.local_part(dx) : dx;
  }

 private:
  struct Saved : Block::Saved {
    Tensor answer, nf, mean, rstd, logits, row_max, sumexp;  // (B, C) rows and their norm, (B, V) logits
  };
  // (B) each sample's answer row; inverse: (B·T), b on row b·T + T - 1, -1 elsewhere.
  const Tensor& rows(int batch, bool inverse) {
    return ctx_.constant_ids(fmt::format("answer_rows:{}:{}", batch, inverse), [&] {
      auto r = answer_rows(batch, m_.seq_len);
      return inverse ? inverse_order(r, static_cast<std::size_t>(batch) * m_.seq_len) : r;
    });
  }

  const ModelSpec& m_;
  BlockContext& ctx_;
  VocabShard vocab_;
};

// Bytes a body block's input takes under full recomputation (the chunk keeps only that).
double recompute_input_bytes(const ActivationQuery& q, double tokens, double width) {
  return q.layout.value_bytes * q.micro_batch * tokens * width / (q.sequence_parallel ? q.tp : 1);
}

}  // namespace

ProjectorDef::ProjectorDef(int layer, const ModelSpec& m)
    : BlockDef(layer),
      patches_(vqa_image_tokens(m)),
      in_(m.vision_encoder.hidden),
      out_(m.hidden),
      mlp_(m.projector == ProjectorKind::mlp) {}

std::vector<ParamInfo> ProjectorDef::parameters() const {
  // LLaVA's names: mm_projector.0 (and, for mlp2x_gelu, the GELU at 1 and mm_projector.2).
  ParamTableBuilder t(layer());
  t.linear("projector.0", in_, out_, TpSplit::replicated, true);
  if (mlp_) t.linear("projector.2", out_, out_, TpSplit::replicated, true);
  return t.take();
}

BlockIo ProjectorDef::io(std::int64_t) const { return {patches_ + 1, in_, patches_, out_}; }

ForwardFlops ProjectorDef::flops(double samples, std::int64_t) const {
  ForwardFlops f;
  f.layers = 2.0 * samples * patches_ * in_ * out_;
  if (mlp_) f.layers += 2.0 * samples * patches_ * out_ * out_;
  return f;
}

double ProjectorDef::activation_bytes(const ActivationQuery& q) const {
  if (q.recompute == Recompute::full) return recompute_input_bytes(q, patches_ + 1, in_);
  // The patch tokens (whole on every tp rank), and the MLP's GELU input and output.
  return q.layout.value_bytes * q.micro_batch * patches_ * (in_ + (mlp_ ? 2.0 * out_ : 0.0));
}

std::unique_ptr<Block> ProjectorDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<Projector>(*this, ctx);
}

std::vector<ParamInfo> QuestionJoinerDef::parameters() const {
  ParamTableBuilder t(layer());
  t.add("language.embed.tokens", {m_.vocab, m_.hidden}, TpSplit::vocab, 0);
  if (m_.position == PositionKind::learned) t.add("language.embed.positions", {m_.seq_len, m_.hidden});
  return t.take();
}

BlockIo QuestionJoinerDef::io(std::int64_t) const { return {vqa_image_tokens(m_), m_.hidden, m_.seq_len, m_.hidden}; }

double QuestionJoinerDef::activation_bytes(const ActivationQuery& q) const {
  // Nothing is saved (ids and positions are the micro-batch's; dropout masks are regenerated).
  if (q.recompute == Recompute::full) return recompute_input_bytes(q, vqa_image_tokens(m_), m_.hidden);
  return 0;
}

std::unique_ptr<Block> QuestionJoinerDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<QuestionJoiner>(*this, ctx);
}

std::vector<ParamInfo> AnswerHeadDef::parameters() const {
  ParamTableBuilder t(layer());
  t.norm("language.final_norm", m_.hidden, m_.norm);
  t.add("language.head", {m_.hidden, m_.vocab}, TpSplit::vocab, 1, {}, true, true);
  return t.take();
}

ForwardFlops AnswerHeadDef::flops(double samples, std::int64_t) const {
  ForwardFlops f;
  f.head = 2.0 * samples * m_.hidden * static_cast<double>(m_.vocab);  // one row per sample
  return f;
}

double AnswerHeadDef::activation_bytes(const ActivationQuery& q) const {
  // The answer rows and their norm (whole on every tp rank), this rank's logits shard, row statistics.
  const double B = q.micro_batch, h = m_.hidden;
  const ActivationLayout& a = q.layout;
  double bytes = a.value_bytes * (2.0 * B * h + B * static_cast<double>(padded_vocab(m_, q.tp)) / q.tp);
  if (a.row_stats) bytes += 4.0 * ((m_.norm == NormKind::layernorm ? 2.0 : 1.0) * B + 2.0 * B);
  return bytes;
}

std::unique_ptr<Block> AnswerHeadDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<AnswerHead>(*this, ctx);
}

void add_vqa_blocks(const ModelSpec& m, ModelBlocks& out) {
  add_vit_encoder(vision_encoder_model(m), "vision.", "vision", "vision", out);
  int layer = m.vision_encoder.layers;
  add_block(out, std::make_unique<ProjectorDef>(layer++, m), "projector");
  add_block(out, std::make_unique<QuestionJoinerDef>(layer++, m), "language");
  LayerShape decoder;
  decoder.width = m.hidden;
  decoder.heads = m.heads, decoder.kv_heads = m.kv_heads, decoder.ffn = m.ffn;
  decoder.causal = true;  // the question reads the image and its own earlier words
  decoder.rope = m.position == PositionKind::rope;
  decoder.rope_theta = m.rope_theta;
  decoder.activation = m.activation;
  decoder.bias = m.bias;
  decoder.tokens = m.seq_len;
  for (int l = 0; l < m.decoder_layers; ++l, ++layer) {
    const std::string name = "language.layers." + std::to_string(l);
    add_block(out, std::make_unique<TransformerLayerDef>(layer, name, decoder, m.norm), "language");
  }
  add_block(out, std::make_unique<AnswerHeadDef>(m), "language");
}

}  // namespace meshtrain
