#include "models/gpt.h"

#include <cmath>
#include <string>

#include "models/init.h"

namespace meshtrain {

struct GptChunk::LayerSaved {
  Tensor x, n1, mean1, rstd1, qkv, attn, lse, x2, n2, mean2, rstd2, up, act;
};
struct GptChunk::HeadSaved {
  Tensor x, nf, meanf, rstdf, logits, row_max, sumexp;
};
struct ChunkActivations {
  std::vector<GptChunk::LayerSaved> layers;  // index: layer - first
  GptChunk::HeadSaved head;
};
void ChunkActivationsDeleter::operator()(ChunkActivations* a) const { delete a; }

namespace {

std::string layer_name(int layer, const char* what) { return "layers." + std::to_string(layer) + "." + what; }

std::vector<ParamInfo> chunk_parameters(const ModelSpec& m, const ChunkLayers& c) {
  std::vector<ParamInfo> out;
  for (auto& p : parameter_table(m)) {
    const bool mine = (p.layer >= c.first && p.layer < c.last) || (c.embedding && p.layer < 0) ||
                      (c.head && p.layer >= m.layers) ||
                      // A tied head on a chunk without the embedding keeps its own copy.
                      (c.head && !c.embedding && m.tied_embeddings && p.name == "embed.tokens");
    if (mine) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

GptChunk::GptChunk(Backend& b, const ModelSpec& m, ChunkLayers layers, TensorParallel tp, ChunkOptions options)
    : b_(b),
      m_(m),
      layers_(layers),
      tp_(std::move(tp)),
      options_(options),
      params_(b, m_, chunk_parameters(m_, layers), ShardCoord{tp_.rank, tp_.size, 0, 1}, options.storage),
      heads_(m.heads / tp_.size),
      kv_heads_(m.kv_heads / tp_.size),
      ffn_(m.ffn / tp_.size),
      vocab_rows_(padded_vocab(m, tp_.size) / tp_.size),
      act_(options.storage.value_dtype),
      sp_(options.sequence_parallel && tp_.size > 1) {}

void GptChunk::tp_all_reduce(Tensor& x) {
  if (tp_.size > 1) b_.all_reduce(x, tp_.group, ReduceOp::sum);
}

DropoutOp GptChunk::dropout(const MicroBatch& mb, int layer, int site) const {
  // A sequence shard draws the mask elements of its rows of the whole (N, C) tensor.
  const std::uint64_t offset = sp_ ? static_cast<std::uint64_t>(tp_.rank * local_rows(mb) * m_.hidden) : 0;
  return {options_.dropout, mix64(mb.dropout_seed ^ mix64(static_cast<std::uint64_t>(layer + 2) * 8 + site)),
          offset};
}

std::int64_t GptChunk::local_rows(const MicroBatch& mb) const {
  const std::int64_t n = static_cast<std::int64_t>(mb.batch) * mb.seq;
  return sp_ ? n / tp_.size : n;
}

Tensor GptChunk::gather_rows(const Tensor& x) {
  const std::int64_t width = x.shape().back();
  Tensor full = b_.empty(Shape{x.numel() / width * tp_.size, width}, x.dtype());
  b_.all_gather(x, full, tp_.group);
  return full;
}

Tensor GptChunk::scatter_rows(const Tensor& x) {
  const std::int64_t width = x.shape().back();
  Tensor shard = b_.empty(Shape{x.numel() / width / tp_.size, width}, x.dtype());
  b_.reduce_scatter(x, shard, tp_.group, ReduceOp::sum);
  return shard;
}

const Tensor& GptChunk::positions(const MicroBatch& mb) {
  if (mb.batch != position_batch_ || mb.seq != position_seq_) {
    std::vector<std::int32_t> host(static_cast<std::size_t>(mb.batch) * mb.seq);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::int32_t>(i % mb.seq);
    position_ids_ = b_.empty(Shape{static_cast<std::int64_t>(host.size())}, DType::i32);
    b_.write(position_ids_, host);
    position_batch_ = mb.batch, position_seq_ = mb.seq;
  }
  return position_ids_;
}

void GptChunk::norm_forward(const std::string& prefix, const Tensor& x, Tensor& out, Tensor& mean, Tensor& rstd) {
  const std::int64_t rows = x.numel() / m_.hidden;
  out = b_.empty(Shape{rows, m_.hidden}, act_);
  rstd = b_.empty(Shape{rows});
  if (m_.norm == NormKind::layernorm) {
    mean = b_.empty(Shape{rows});
    b_.layernorm_forward(x, params_[prefix + ".weight"].value, params_[prefix + ".bias"].value, out, mean, rstd,
                         m_.norm_eps);
  } else {
    b_.rmsnorm_forward(x, params_[prefix + ".weight"].value, out, rstd, m_.norm_eps);
  }
}

void GptChunk::norm_backward(const std::string& prefix, const Tensor& dout, const Tensor& x, const Tensor& mean,
                             const Tensor& rstd, Tensor& dx) {
  dx = b_.empty(Shape{x.numel() / m_.hidden, m_.hidden}, act_);
  const ParamSlot& w = params_[prefix + ".weight"];
  const bool layernorm = m_.norm == NormKind::layernorm;
  Tensor dw = w.grad, db = layernorm ? params_[prefix + ".bias"].grad : Tensor();
  Tensor partial;  // (C or 2C) this sequence shard's part of the weight (and bias) gradient
  if (sp_) {
    partial = b_.empty(Shape{(layernorm ? 2 : 1) * m_.hidden});
    b_.fill(partial, 0.f);
    dw = partial.slice(0, m_.hidden);
    if (layernorm) db = partial.slice(m_.hidden, m_.hidden);
  }
  if (layernorm) b_.layernorm_backward(dout, x, w.value, mean, rstd, dx, dw, db);
  else b_.rmsnorm_backward(dout, x, w.value, rstd, dx, dw);
  if (!sp_) return;
  // Each tp rank saw only its rows: the replicated norm's gradient sums the shards' parts.
  b_.all_reduce(partial, tp_.group, ReduceOp::sum);
  Tensor grad = w.grad;
  b_.add(grad, partial.slice(0, m_.hidden), grad);
  if (layernorm) {
    Tensor bias_grad = params_[prefix + ".bias"].grad;
    b_.add(bias_grad, partial.slice(m_.hidden, m_.hidden), bias_grad);
  }
}

void GptChunk::linear(const std::string& name, const Tensor& x_in, Tensor& y, bool row_parallel) {
  const ParamSlot& w = params_[name + ".weight"];
  GemmOp op;
  // A row-parallel bias is added once, by tp rank 0, before the all-reduce sums the partial products.
  if (m_.bias && (!row_parallel || tp_.rank == 0)) op.bias = params_[name + ".bias"].value;
  const std::int64_t in = w.value.shape()[0];
  // Sequence parallelism: a column-parallel GEMM reads every row, gathered from the shards.
  const Tensor x = sp_ && !row_parallel ? gather_rows(x_in.view(Shape{x_in.numel() / in, in})) : x_in;
  const std::int64_t rows = x.numel() / in;
  y = b_.empty(Shape{rows, w.value.shape()[1]}, act_);
  b_.gemm(x.view(Shape{rows, in}), w.value, y, op);
  if (!row_parallel) return;
  if (sp_) y = scatter_rows(y);  // each rank keeps its sequence shard of the sum
  else tp_all_reduce(y);
}

void GptChunk::linear_backward(const std::string& name, const Tensor& x_in, const Tensor& dy_in, Tensor& dx,
                               bool row_parallel) {
  const ParamSlot& w = params_[name + ".weight"];
  const std::int64_t in = w.value.shape()[0], out = w.value.shape()[1];
  // Sequence parallelism, the conjugates of forward: a row-parallel output's gradient arrives as
  // the sequence shard and is gathered; a column-parallel input was a shard and is gathered again.
  const Tensor dy = sp_ && row_parallel ? gather_rows(dy_in.view(Shape{dy_in.numel() / out, out})) : dy_in;
  const Tensor x = sp_ && !row_parallel ? gather_rows(x_in.view(Shape{x_in.numel() / in, in})) : x_in;
  const std::int64_t rows = dy.numel() / out;
  const Tensor dy2 = dy.view(Shape{rows, out});
  dx = b_.empty(Shape{rows, in}, act_);
  b_.gemm(dy2, w.value, dx, GemmOp{false, true});
  // The input of a column-parallel layer fed every tp rank: its gradient sums their parts.
  if (!row_parallel) {
    if (sp_) dx = scatter_rows(dx);
    else tp_all_reduce(dx);
  }
  Tensor dw = w.grad;
  b_.gemm(x.view(Shape{rows, in}), dy2, dw, GemmOp{true, false, 1.f, 1.f});
  if (m_.bias) {
    Tensor db = params_[name + ".bias"].grad;
    b_.bias_backward(dy2, db);
  }
}

Tensor GptChunk::layer_forward(int l, const MicroBatch& mb, const Tensor& x_in, LayerSaved* saved) {
  const std::int64_t B = mb.batch, T = mb.seq, N = B * T, R = local_rows(mb), C = m_.hidden, D = m_.head_dim();
  const int H = heads_, G = kv_heads_;
  LayerSaved s;
  s.x = x_in.view(Shape{R, C});
  norm_forward(layer_name(l, "norm1"), s.x, s.n1, s.mean1, s.rstd1);
  linear(layer_name(l, "attn.qkv"), s.n1, s.qkv, false);
  Tensor qkv4 = s.qkv.view(Shape{B, T, H + 2 * G, D});
  if (m_.position == PositionKind::rope) b_.rope(qkv4, H + 2 * G, H + G, m_.rope_theta, false);
  s.attn = b_.empty(Shape{N, H * D}, act_);
  s.lse = b_.empty(Shape{B, H, T});
  Tensor attn4 = s.attn.view(Shape{B, T, H, D});
  const AttentionOp attention{H, G, static_cast<int>(D), 1.f / std::sqrt(static_cast<float>(D))};
  b_.attention_forward(qkv4, attn4, s.lse, attention);
  Tensor proj;
  linear(layer_name(l, "attn.out"), s.attn, proj, true);
  if (options_.dropout > 0) b_.dropout_forward(proj, proj, dropout(mb, l, 0));
  s.x2 = b_.empty(Shape{R, C}, act_);
  b_.add(s.x, proj, s.x2);
  norm_forward(layer_name(l, "norm2"), s.x2, s.n2, s.mean2, s.rstd2);
  linear(layer_name(l, "mlp.up"), s.n2, s.up, false);
  s.act = b_.empty(Shape{N, ffn_}, act_);
  if (m_.activation == Activation::gelu) b_.gelu_forward(s.up, s.act);
  else b_.swiglu_forward(s.up, s.act);
  Tensor down;
  linear(layer_name(l, "mlp.down"), s.act, down, true);
  if (options_.dropout > 0) b_.dropout_forward(down, down, dropout(mb, l, 1));
  Tensor out = b_.empty(Shape{R, C}, act_);
  b_.add(s.x2, down, out);
  if (saved) *saved = std::move(s);
  return out;
}

Tensor GptChunk::layer_backward(int l, const MicroBatch& mb, LayerSaved& s, const Tensor& dout_in) {
  const std::int64_t B = mb.batch, T = mb.seq, R = local_rows(mb), C = m_.hidden, D = m_.head_dim();
  const int H = heads_, G = kv_heads_;
  const Tensor dout = dout_in.view(Shape{R, C});
  Tensor ddown = dout;
  if (options_.dropout > 0) {
    ddown = b_.empty(Shape{R, C}, act_);
    b_.dropout_backward(dout, ddown, dropout(mb, l, 1));
  }
  Tensor dact, dn2, dx2_norm, dattn, dn1, dx_norm;
  linear_backward(layer_name(l, "mlp.down"), s.act, ddown, dact, true);
  Tensor dup = b_.empty(s.up.shape(), act_);
  if (m_.activation == Activation::gelu) b_.gelu_backward(dact, s.up, dup);
  else b_.swiglu_backward(dact, s.up, dup);
  linear_backward(layer_name(l, "mlp.up"), s.n2, dup, dn2, false);
  norm_backward(layer_name(l, "norm2"), dn2, s.x2, s.mean2, s.rstd2, dx2_norm);
  Tensor dx2 = b_.empty(Shape{R, C}, act_);
  b_.add(dout, dx2_norm, dx2);
  Tensor dproj = dx2;
  if (options_.dropout > 0) {
    dproj = b_.empty(Shape{R, C}, act_);
    b_.dropout_backward(dx2, dproj, dropout(mb, l, 0));
  }
  linear_backward(layer_name(l, "attn.out"), s.attn, dproj, dattn, true);
  Tensor dqkv = b_.empty(s.qkv.shape(), act_);
  Tensor dqkv4 = dqkv.view(Shape{B, T, H + 2 * G, D});
  const AttentionOp attention{H, G, static_cast<int>(D), 1.f / std::sqrt(static_cast<float>(D))};
  b_.attention_backward(dattn.view(Shape{B, T, H, D}), s.qkv.view(Shape{B, T, H + 2 * G, D}),
                        s.attn.view(Shape{B, T, H, D}), s.lse, dqkv4, attention);
  if (m_.position == PositionKind::rope) b_.rope(dqkv4, H + 2 * G, H + G, m_.rope_theta, true);
  linear_backward(layer_name(l, "attn.qkv"), s.n1, dqkv, dn1, false);
  norm_backward(layer_name(l, "norm1"), dn1, s.x, s.mean1, s.rstd1, dx_norm);
  Tensor dx = b_.empty(Shape{R, C}, act_);
  b_.add(dx2, dx_norm, dx);
  return dx;
}

Tensor GptChunk::embed_forward(const MicroBatch& mb) {
  const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq, R = local_rows(mb);
  Tensor x = b_.empty(Shape{N, m_.hidden}, act_);
  b_.embedding_forward(params_["embed.tokens"].value, mb.ids, x, tp_.rank * vocab_rows_);
  // Each tp rank looked up only the tokens of its vocabulary shard: sum them (its sequence shard under SP).
  if (sp_) x = scatter_rows(x);
  else tp_all_reduce(x);
  if (m_.position == PositionKind::learned) {
    Tensor pe = b_.empty(Shape{R, m_.hidden}, act_);
    const Tensor ids = sp_ ? positions(mb).slice(tp_.rank * R, R) : positions(mb);
    b_.embedding_forward(params_["embed.positions"].value, ids, pe, 0);
    b_.add(x, pe, x);
  }
  if (options_.dropout > 0) b_.dropout_forward(x, x, dropout(mb, -1, 0));
  return x;
}

void GptChunk::embed_backward(const MicroBatch& mb, const Tensor& dx_in) {
  Tensor dx = dx_in;
  if (options_.dropout > 0) {
    dx = b_.empty(dx_in.shape(), act_);
    b_.dropout_backward(dx_in, dx, dropout(mb, -1, 0));
  }
  // Every token's gradient reaches the vocabulary shard that owns it, and every position's row.
  if (sp_) dx = gather_rows(dx.view(Shape{local_rows(mb), m_.hidden}));
  Tensor dtokens = params_["embed.tokens"].grad;
  b_.embedding_backward(dx, mb.ids, dtokens, tp_.rank * vocab_rows_);
  if (m_.position == PositionKind::learned) {
    Tensor dpos = params_["embed.positions"].grad;
    b_.embedding_backward(dx, positions(mb), dpos, 0);
  }
}

Tensor GptChunk::head_forward(const MicroBatch& mb, const Tensor& x, HeadSaved& s) {
  const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq;
  s.x = x.view(Shape{local_rows(mb), m_.hidden});
  norm_forward("final_norm", s.x, s.nf, s.meanf, s.rstdf);
  // The vocabulary-parallel projection reads every row: gathered under SP (and again in backward).
  const Tensor nf = sp_ ? gather_rows(s.nf) : s.nf;
  s.logits = b_.empty(Shape{N, vocab_rows_}, act_);
  if (m_.tied_embeddings) b_.gemm(nf, params_["embed.tokens"].value, s.logits, GemmOp{false, true});
  else b_.gemm(nf, params_["head"].value, s.logits, GemmOp{});
  s.row_max = b_.empty(Shape{N});
  b_.cross_entropy_max(s.logits, s.row_max);
  if (tp_.size > 1) b_.all_reduce(s.row_max, tp_.group, ReduceOp::max);
  s.sumexp = b_.empty(Shape{N});
  Tensor target_logit = b_.empty(Shape{N});
  b_.cross_entropy_partials(s.logits, mb.targets, s.row_max, tp_.rank * vocab_rows_, s.sumexp, target_logit);
  tp_all_reduce(s.sumexp);
  tp_all_reduce(target_logit);
  Tensor losses = b_.empty(Shape{N});
  b_.cross_entropy_loss(s.row_max, s.sumexp, target_logit, losses);
  Tensor loss_sum = b_.empty(Shape{1});
  b_.sum(losses, loss_sum, 1.f, false);
  return loss_sum;
}

Tensor GptChunk::head_backward(const MicroBatch& mb, HeadSaved& s, float loss_scale) {
  const std::int64_t N = static_cast<std::int64_t>(mb.batch) * mb.seq;
  Tensor dlogits = b_.empty(s.logits.shape(), act_);
  b_.cross_entropy_backward(s.logits, mb.targets, s.row_max, s.sumexp, tp_.rank * vocab_rows_, loss_scale, dlogits);
  s.logits = Tensor();  // the largest activation: free it before the next allocations
  Tensor dnf = b_.empty(Shape{N, m_.hidden}, act_);
  const Tensor nf = sp_ ? gather_rows(s.nf) : s.nf;
  if (m_.tied_embeddings) {
    const ParamSlot& w = params_["embed.tokens"];
    b_.gemm(dlogits, w.value, dnf, GemmOp{});
    Tensor dw = w.grad;
    b_.gemm(dlogits, nf, dw, GemmOp{true, false, 1.f, 1.f});
  } else {
    const ParamSlot& w = params_["head"];
    b_.gemm(dlogits, w.value, dnf, GemmOp{false, true});
    Tensor dw = w.grad;
    b_.gemm(nf, dlogits, dw, GemmOp{true, false, 1.f, 1.f});
  }
  // The head is column-parallel over the vocabulary: its input gradient sums the shards' parts.
  if (sp_) dnf = scatter_rows(dnf);
  else tp_all_reduce(dnf);
  Tensor dx;
  norm_backward("final_norm", dnf, s.x, s.meanf, s.rstdf, dx);
  return dx;
}

Tensor GptChunk::forward(const MicroBatch& mb, const Tensor& input, SavedActivations& saved) {
  auto before = [&](int layer) {
    if (hooks_.before_forward) hooks_.before_forward(layer);
  };
  auto after = [&](int layer) {
    if (hooks_.after_forward) hooks_.after_forward(layer);
  };
  saved.reset(new ChunkActivations);
  saved->layers.resize(static_cast<std::size_t>(layers_.last - layers_.first));
  Tensor h = input;
  if (layers_.embedding) {
    before(-1);
    h = embed_forward(mb);
    after(-1);
  }
  for (int l = layers_.first; l < layers_.last; ++l) {
    LayerSaved& s = saved->layers[static_cast<std::size_t>(l - layers_.first)];
    before(l);
    if (options_.recompute == Recompute::full) {
      s.x = h;  // only the layer input; backward runs the forward again
      h = layer_forward(l, mb, h, nullptr);
    } else {
      h = layer_forward(l, mb, h, &s);
    }
    after(l);
  }
  if (!layers_.head) return h;
  before(m_.layers);
  Tensor loss = head_forward(mb, h, saved->head);
  after(m_.layers);
  return loss;
}

Tensor GptChunk::backward(const MicroBatch& mb, SavedActivations& saved, const Tensor& dout, float loss_scale) {
  auto before = [&](int layer) {
    if (hooks_.before_backward) hooks_.before_backward(layer);
  };
  auto after = [&](int layer) {
    if (hooks_.after_backward) hooks_.after_backward(layer);
  };
  Tensor g = dout;
  if (layers_.head) {
    before(m_.layers);
    g = head_backward(mb, saved->head, loss_scale);
    after(m_.layers);
  }
  saved->head = HeadSaved{};
  for (int l = layers_.last - 1; l >= layers_.first; --l) {
    LayerSaved& s = saved->layers[static_cast<std::size_t>(l - layers_.first)];
    before(l);
    if (options_.recompute == Recompute::full) layer_forward(l, mb, s.x, &s);
    g = layer_backward(l, mb, s, g);
    s = LayerSaved{};
    after(l);
  }
  saved.reset();
  if (layers_.embedding) {
    before(-1);
    embed_backward(mb, g);
    after(-1);
    return Tensor();
  }
  return g;
}

}  // namespace meshtrain
