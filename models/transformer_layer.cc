#include "models/transformer_layer.h"

#include <algorithm>
#include <cmath>

#include "models/block_context.h"

namespace meshtrain {

std::vector<std::int32_t> window_order(int batch, int grid, int window, int shift) {
  std::vector<std::int32_t> order;
  order.reserve(static_cast<std::size_t>(batch) * grid * grid);
  const int per_side = grid / window;
  for (int b = 0; b < batch; ++b)
    for (int wy = 0; wy < per_side; ++wy)
      for (int wx = 0; wx < per_side; ++wx)
        for (int py = 0; py < window; ++py)
          for (int px = 0; px < window; ++px) {
            // torch.roll(x, (-shift, -shift)): position y of the shifted image holds y + shift.
            const int y = (wy * window + py + shift) % grid, x = (wx * window + px + shift) % grid;
            order.push_back((b * grid + y) * grid + x);
          }
  return order;
}

std::vector<std::int32_t> inverse_order(const std::vector<std::int32_t>& order, std::size_t rows) {
  std::vector<std::int32_t> inverse(rows == 0 ? order.size() : rows, -1);
  for (std::size_t i = 0; i < order.size(); ++i)
    if (order[i] >= 0) inverse[static_cast<std::size_t>(order[i])] = static_cast<std::int32_t>(i);
  return inverse;
}

std::vector<std::int32_t> relative_position_index(int window) {
  const int T = window * window, side = 2 * window - 1;
  std::vector<std::int32_t> index(static_cast<std::size_t>(T) * T);
  for (int i = 0; i < T; ++i)
    for (int j = 0; j < T; ++j) {
      const int dy = i / window - j / window + window - 1, dx = i % window - j % window + window - 1;
      index[static_cast<std::size_t>(i) * T + j] = dy * side + dx;
    }
  return index;
}

std::vector<float> shifted_window_mask(int grid, int window, int shift) {
  // Regions of the shifted image (Liu et al. 2021, Sec. 3.2): rows and columns
  // [0, grid - window), [grid - window, grid - shift) and [grid - shift, grid)
  // come from different places of the image; tokens of different regions
  // that one window holds must not attend to each other.
  auto region = [&](int y) { return y < grid - window ? 0 : (y < grid - shift ? 1 : 2); };
  const int per_side = grid / window, T = window * window;
  constexpr float kApart = -100.f;  // as the reference implementation: exp(-100) underflows in the softmax
  std::vector<float> mask(static_cast<std::size_t>(per_side) * per_side * T * T);
  std::size_t k = 0;
  for (int wy = 0; wy < per_side; ++wy)
    for (int wx = 0; wx < per_side; ++wx) {
      std::vector<int> label(static_cast<std::size_t>(T));
      for (int p = 0; p < T; ++p)
        label[static_cast<std::size_t>(p)] = region(wy * window + p / window) * 3 + region(wx * window + p % window);
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j)
          mask[k++] = label[static_cast<std::size_t>(i)] == label[static_cast<std::size_t>(j)] ? 0.f : kApart;
    }
  return mask;
}

namespace {

class TransformerLayer : public Block {
 public:
  TransformerLayer(const TransformerLayerDef& def, BlockContext& ctx)
      : def_(def),
        s_(def.shape()),
        ctx_(ctx),
        heads_(s_.heads / ctx.tp.size),
        kv_heads_(s_.kv_heads / ctx.tp.size),
        ffn_(s_.ffn / ctx.tp.size) {
    if (s_.moe.experts > 0)
      moe_ = std::make_unique<MoeMlp>(ctx, def.name() + ".moe", s_.width, s_.ffn, s_.activation, s_.moe);
  }

  Tensor forward(const MicroBatch& mb, const Tensor& x, std::unique_ptr<Block::Saved>* saved) override {
    return forward_phased(mb, x, saved).run();
  }
  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor& dout, float loss_scale) override {
    return backward_phased(mb, saved, dout, loss_scale).run();
  }
  // With experts, the phases are the MoE MLP's (MoeMlp::forward): the layer's attention joins the
  // first, its residual add the last.
  Phased<Tensor> forward_phased(const MicroBatch& mb, Tensor x, std::unique_ptr<Block::Saved>* saved) override;
  Phased<Tensor> backward_phased(const MicroBatch& mb, Block::Saved& saved, Tensor dout, float loss_scale) override;

 private:
  struct Saved : Block::Saved {
    // qkv and attn are in window order under window attention.
    Tensor x, n1, mean1, rstd1, qkv, attn, lse, x2, n2, mean2, rstd2, up, act;
    ContextAttentionSaved context;  // under context parallelism, in place of qkv and lse
    std::unique_ptr<Block::Saved> moe;
  };
  std::string name(const char* what) const { return def_.name() + "." + what; }
  std::int64_t tokens(const MicroBatch& mb) const { return s_.tokens > 0 ? s_.tokens : mb.seq; }
  bool windowed() const { return s_.window > 0; }
  // Context parallelism splits the micro-batch's sequences (models/context_parallel.h).
  bool context_parallel() const { return ctx_.options.context.size > 1; }
  float rope_theta() const { return s_.rope ? s_.rope_theta : 0.f; }
  // Recompute module layernorm: an MoE layer's pre-MLP norm frees its output after forward (with
  // the experts' hold on it), and backward makes it again from the kept input x2 just before the
  // experts' backward. Transformer Engine fuses the other norms into their linear layers.
  bool recompute_norm() const { return moe_ != nullptr && ctx_.options.recompute_modules.layernorm; }
  Tensor recomputed_norm(const Tensor& x2);
  AttentionOp attention_op() const;
  // Window order of the micro-batch's rows and its inverse (windowed only).
  const Tensor& order(const MicroBatch& mb, bool inverse);
  // The (T, T, H) relative position bias of this rank's heads.
  Tensor relative_bias();

  const TransformerLayerDef& def_;
  const LayerShape& s_;
  BlockContext& ctx_;
  int heads_, kv_heads_, ffn_;  // on this rank
  std::unique_ptr<MoeMlp> moe_;
};

Tensor TransformerLayer::recomputed_norm(const Tensor& x2) {
  Tensor out, mean, rstd;
  ctx_.norm_forward(name("norm2"), x2, out, mean, rstd);
  return out;
}

AttentionOp TransformerLayer::attention_op() const {
  const int D = s_.dim();
  AttentionOp op;
  op.heads = heads_, op.kv_heads = kv_heads_, op.head_dim = D;
  op.scale = 1.f / std::sqrt(static_cast<float>(D));
  op.causal = s_.causal;
  op.sliding_window = s_.sliding_window;
  if (s_.sinks) op.sinks = ctx_.params[name("attn.sinks")].value;
  if (windowed() && s_.shift > 0) {
    const std::int64_t T = static_cast<std::int64_t>(s_.window) * s_.window;
    const std::int64_t windows = def_.windows_per_sample();
    op.mask = ctx_.constant_values(fmt::format("mask:{}:{}:{}", s_.grid, s_.window, s_.shift),
                                   Shape{windows, T, T}, DType::f32,
                                   [&] { return shifted_window_mask(s_.grid, s_.window, s_.shift); });
  }
  return op;
}

const Tensor& TransformerLayer::order(const MicroBatch& mb, bool inverse) {
  const std::string key = fmt::format("window:{}:{}:{}:{}:{}", mb.batch, s_.grid, s_.window, s_.shift, inverse);
  return ctx_.constant_ids(key, [&] {
    auto o = window_order(mb.batch, s_.grid, s_.window, s_.shift);
    return inverse ? inverse_order(o) : o;
  });
}

Tensor TransformerLayer::relative_bias() {
  const Tensor& index = ctx_.constant_ids(fmt::format("relative:{}", s_.window),
                                          [&] { return relative_position_index(s_.window); });
  const std::int64_t T = static_cast<std::int64_t>(s_.window) * s_.window;
  Tensor bias = ctx_.b.empty(Shape{T, T, heads_}, ctx_.act);
  ctx_.b.gather_rows(ctx_.params[name("attn.rel_bias")].value, index, bias);
  return bias;
}

Phased<Tensor> TransformerLayer::forward_phased(const MicroBatch& mb, Tensor x_in, std::unique_ptr<Block::Saved>* saved) {
  Backend& b = ctx_.b;
  const std::int64_t B = mb.batch, T = tokens(mb), N = B * T, R = ctx_.local_rows(N), C = s_.width;
  const std::int64_t D = s_.dim();
  const int H = heads_, G = kv_heads_, l = def_.layer();
  auto s = std::make_unique<Saved>();
  s->x = x_in.view(Shape{R, C});
  ctx_.norm_forward(name("norm1"), s->x, s->n1, s->mean1, s->rstd1);
  ctx_.linear(name("attn.qkv"), s->n1, s->qkv, LinearKind::column);
  // Attention batch entries: samples, or each sample's windows.
  std::int64_t entries = B, span = T;
  AttentionOp op = attention_op();
  if (context_parallel()) {
    s->attn = context_attention_forward(ctx_, mb.batch, T, s->qkv, op, rope_theta(), s->context);
    s->qkv = Tensor();  // kept in s->context
  } else if (windowed()) {
    Tensor natural = s->qkv;
    s->qkv = b.empty(natural.shape(), ctx_.act);
    b.gather_rows(natural, order(mb, false), s->qkv);
    span = static_cast<std::int64_t>(s_.window) * s_.window;
    entries = N / span;
    op.bias = relative_bias();
  }
  if (!context_parallel()) {
    Tensor qkv4 = s->qkv.view(Shape{entries, span, H + 2 * G, D});
    if (s_.rope) b.rope(qkv4, H + 2 * G, H + G, s_.rope_theta, false, 0);
    s->attn = b.empty(Shape{N, H * D}, ctx_.act);
    s->lse = b.empty(Shape{entries, H, span});
    Tensor attn4 = s->attn.view(Shape{entries, span, H, D});
    b.attention_forward(qkv4, attn4, s->lse, op);
  }
  Tensor attn = s->attn;
  if (windowed()) {
    attn = b.empty(s->attn.shape(), ctx_.act);
    b.gather_rows(s->attn, order(mb, true), attn);
  }
  Tensor proj;
  ctx_.linear(name("attn.out"), attn, proj, LinearKind::row);
  attn = Tensor();
  if (ctx_.options.dropout > 0) b.dropout_forward(proj, proj, ctx_.dropout(mb, l, 0, R, C));
  s->x2 = b.empty(Shape{R, C}, ctx_.act);
  b.add(s->x, proj, s->x2);
  ctx_.norm_forward(name("norm2"), s->x2, s->n2, s->mean2, s->rstd2);
  Tensor down;
  if (moe_) {
    Phased<Tensor> mlp = moe_->forward(mb, N, s->n2, saved ? &s->moe : nullptr);
    while (mlp.resume()) co_yield Pause{};
    down = mlp.result();
    if (recompute_norm() && s->moe) {
      s->n2 = Tensor();  // made again in backward (recomputed_norm)
      moe_->release_input(*s->moe);
    }
  } else {
    ctx_.linear(name("mlp.up"), s->n2, s->up, LinearKind::column);
    s->act = b.empty(Shape{N, ffn_}, ctx_.act);
    if (s_.activation == Activation::gelu) b.gelu_forward(s->up, s->act);
    else b.swiglu_forward(s->up, s->act);
    ctx_.linear(name("mlp.down"), s->act, down, LinearKind::row);
  }
  if (ctx_.options.dropout > 0) b.dropout_forward(down, down, ctx_.dropout(mb, l, 1, R, C));
  Tensor out = b.empty(Shape{R, C}, ctx_.act);
  b.add(s->x2, down, out);
  if (saved) *saved = std::move(s);
  co_return out;
}

Phased<Tensor> TransformerLayer::backward_phased(const MicroBatch& mb, Block::Saved& saved, Tensor dout_in,
                                                 float loss_scale) {
  Backend& b = ctx_.b;
  Saved& s = static_cast<Saved&>(saved);
  const std::int64_t B = mb.batch, T = tokens(mb), N = B * T, R = ctx_.local_rows(N), C = s_.width;
  const std::int64_t D = s_.dim();
  const int H = heads_, G = kv_heads_, l = def_.layer();
  const Tensor dout = dout_in.view(Shape{R, C});
  Tensor ddown = dout;
  if (ctx_.options.dropout > 0) {
    ddown = b.empty(Shape{R, C}, ctx_.act);
    b.dropout_backward(dout, ddown, ctx_.dropout(mb, l, 1, R, C));
  }
  Tensor dact, dn2, dx2_norm, dattn, dn1, dx_norm;
  if (moe_) {
    if (!s.n2.defined()) moe_->restore_input(*s.moe, recomputed_norm(s.x2));
    Phased<Tensor> mlp = moe_->backward(mb, *s.moe, ddown, loss_scale);
    while (mlp.resume()) co_yield Pause{};
    dn2 = mlp.result();
    s.moe.reset();
  } else {
    ctx_.linear_backward(name("mlp.down"), s.act, ddown, &dact, LinearKind::row);
    Tensor dup = b.empty(s.up.shape(), ctx_.act);
    if (s_.activation == Activation::gelu) b.gelu_backward(dact, s.up, dup);
    else b.swiglu_backward(dact, s.up, dup);
    ctx_.linear_backward(name("mlp.up"), s.n2, dup, &dn2, LinearKind::column);
  }
  ctx_.norm_backward(name("norm2"), dn2, s.x2, s.mean2, s.rstd2, dx2_norm);
  Tensor dx2 = b.empty(Shape{R, C}, ctx_.act);
  b.add(dout, dx2_norm, dx2);
  Tensor dproj = dx2;
  if (ctx_.options.dropout > 0) {
    dproj = b.empty(Shape{R, C}, ctx_.act);
    b.dropout_backward(dx2, dproj, ctx_.dropout(mb, l, 0, R, C));
  }
  std::int64_t entries = B, span = T;
  AttentionOp op = attention_op();
  if (s_.sinks) op.dsinks = ctx_.params[name("attn.sinks")].grad;  // added into, as every gradient
  if (windowed()) {
    // The output projection read the attention output in the image's row order: gather it again.
    Tensor attn = b.empty(s.attn.shape(), ctx_.act);
    b.gather_rows(s.attn, order(mb, true), attn);
    Tensor dnatural;
    ctx_.linear_backward(name("attn.out"), attn, dproj, &dnatural, LinearKind::row);
    attn = Tensor();
    dattn = b.empty(dnatural.shape(), ctx_.act);
    b.gather_rows(dnatural, order(mb, false), dattn);
    span = static_cast<std::int64_t>(s_.window) * s_.window;
    entries = N / span;
    op.bias = relative_bias();
    op.dbias = b.empty(Shape{span, span, H});
  } else {
    ctx_.linear_backward(name("attn.out"), s.attn, dproj, &dattn, LinearKind::row);
  }
  Tensor dqkv;
  if (context_parallel()) {
    dqkv = context_attention_backward(ctx_, mb.batch, T, dattn, op, rope_theta(), s.context);
  } else {
    dqkv = b.empty(s.qkv.shape(), ctx_.act);
    Tensor dqkv4 = dqkv.view(Shape{entries, span, H + 2 * G, D});
    b.attention_backward(dattn.view(Shape{entries, span, H, D}), s.qkv.view(Shape{entries, span, H + 2 * G, D}),
                         s.attn.view(Shape{entries, span, H, D}), s.lse, dqkv4, op);
    if (s_.rope) b.rope(dqkv4, H + 2 * G, H + G, s_.rope_theta, true, 0);
  }
  if (windowed()) {
    Tensor dtable = ctx_.params[name("attn.rel_bias")].grad;
    const Tensor& index = ctx_.constant_ids(fmt::format("relative:{}", s_.window),
                                            [&] { return relative_position_index(s_.window); });
    b.embedding_backward(op.dbias.view(Shape{span * span, H}), index, dtable, 0);
    Tensor natural = b.empty(dqkv.shape(), ctx_.act);
    b.gather_rows(dqkv, order(mb, true), natural);
    dqkv = natural;
  }
  ctx_.linear_backward(name("attn.qkv"), s.n1, dqkv, &dn1, LinearKind::column);
  ctx_.norm_backward(name("norm1"), dn1, s.x, s.mean1, s.rstd1, dx_norm);
  Tensor dx = b.empty(Shape{R, C}, ctx_.act);
  b.add(dx2, dx_norm, dx);
  co_return dx;
}

}  // namespace

TransformerLayerDef::TransformerLayerDef(int layer, std::string name, LayerShape shape, NormKind norm)
    : BlockDef(layer), name_(std::move(name)), shape_(shape), norm_(norm) {}

std::int64_t TransformerLayerDef::windows_per_sample() const {
  if (shape_.window == 0) return 1;
  const std::int64_t side = shape_.grid / shape_.window;
  return side * side;
}

std::int64_t TransformerLayerDef::attention_span(std::int64_t seq) const {
  return shape_.window > 0 ? static_cast<std::int64_t>(shape_.window) * shape_.window : tokens(seq);
}

std::vector<ParamInfo> TransformerLayerDef::parameters() const {
  const LayerShape& s = shape_;
  const std::int64_t C = s.width, D = s.dim(), H = s.heads, G = s.kv_heads, F = s.ffn;
  ParamTableBuilder t(layer());
  t.norm(name_ + ".norm1", C, norm_);
  t.linear(name_ + ".attn.qkv", C, (H + 2 * G) * D, TpSplit::column, s.bias, {H * D, G * D, G * D});
  if (s.window > 0) {
    // One bias per head and relative offset (2M - 1)² (Liu et al. 2021, eq. 4), split with the heads.
    const std::int64_t offsets = (2 * s.window - 1) * (2 * s.window - 1);
    t.add(name_ + ".attn.rel_bias", {offsets, H}, TpSplit::column, 1);
  }
  if (s.sinks) t.add(name_ + ".attn.sinks", {H}, TpSplit::column, 0);  // one logit per head (gpt-oss)
  t.linear(name_ + ".attn.out", H * D, C, TpSplit::row, s.bias);
  t.norm(name_ + ".norm2", C, norm_);
  const bool glu = s.activation == Activation::swiglu;
  const std::int64_t up = glu ? 2 * F : F;
  const std::vector<std::int64_t> up_segments = glu ? std::vector<std::int64_t>{F, F} : std::vector<std::int64_t>{F};
  if (s.moe.experts > 0) {
    add_moe_parameters(t, name_ + ".moe", s.width, s.ffn, s.activation, s.bias, s.moe);
  } else {
    t.linear(name_ + ".mlp.up", C, up, TpSplit::column, s.bias, up_segments);
    t.linear(name_ + ".mlp.down", F, C, TpSplit::row, s.bias);
  }
  return t.take();
}

BlockIo TransformerLayerDef::io(std::int64_t seq) const {
  return {tokens(seq), shape_.width, tokens(seq), shape_.width};
}

ForwardFlops TransformerLayerDef::flops(double samples, std::int64_t seq) const {
  const double rows = samples * static_cast<double>(tokens(seq));
  ForwardFlops f;
  for (const ParamInfo& p : parameters()) {
    if (!p.matmul) continue;
    double macs_per_token = static_cast<double>(p.numel());
    // Each token passes through top_k of the experts' matrices.
    if (p.expert) macs_per_token = macs_per_token / shape_.moe.experts * shape_.moe.top_k;
    f.layers += 2.0 * rows * macs_per_token;
  }
  // q·kᵀ and p·v: each 2·rows·span·(H·D), the full score matrix (Megatron's convention). A sliding
  // window's query reads at most `sliding_window` keys: the same convention over the window's width.
  const double width = static_cast<double>(shape_.dim()) * shape_.heads;
  std::int64_t span = attention_span(seq);
  if (shape_.sliding_window > 0) span = std::min<std::int64_t>(span, shape_.sliding_window);
  f.attention = 2.0 * (2.0 * rows * static_cast<double>(span) * width);
  f.layers += f.attention;
  return f;
}

// Korthikanti et al. 2022, Sec. 4, as a list of saved tensors in units of
// rows·width (engine/memory/memory_model.h spells out the terms): the norms' inputs
// and outputs (4, replicated over tp unless sequence parallel), q, k, v, the
// attention output, the MLP's first output and second input (split over tp),
// dropout masks, materialised attention probabilities, fp32 row statistics.
double TransformerLayerDef::activation_bytes(const ActivationQuery& q) const {
  const LayerShape& s = shape_;
  const double rows = q.micro_batch * static_cast<double>(tokens(static_cast<std::int64_t>(q.seq)));
  const double h = s.width, t = q.tp, sbh = rows * h;
  const double rep = q.sequence_parallel ? t : 1.0;
  const ActivationLayout& a = q.layout;
  if (q.recompute == Recompute::full) return a.value_bytes * sbh / rep;
  const double glu = s.activation == Activation::swiglu ? 2.0 : 1.0;
  const double D = static_cast<double>(s.dim());
  const double qkv = static_cast<double>(s.heads + 2 * s.kv_heads) * D / h;
  const double attention_out = static_cast<double>(s.heads) * D / h;
  const double mlp_in = s.moe.experts > 0 ? 0.0 : glu * s.ffn / h, mlp_out = s.moe.experts > 0 ? 0.0 : s.ffn / h;
  // GEMM inputs (the two norms' outputs, the attention output, the MLP's second input) may be kept narrower.
  const double gemm_in = a.gemm_input_bytes > 0 ? a.gemm_input_bytes : a.value_bytes;
  // Recompute module layernorm frees an MoE layer's pre-MLP norm output (the experts' input).
  const double norm_outputs = q.recompute_modules.layernorm && s.moe.experts > 0 ? 1.0 : 2.0;
  double bytes = a.value_bytes * (2.0 * sbh / rep + (qkv + mlp_in) * sbh / t) +
                 gemm_in * (norm_outputs * sbh / rep + (attention_out + mlp_out) * sbh / t);
  if (s.moe.experts > 0)
    bytes += moe_activation_bytes(rows, s.width, s.ffn, s.activation, s.moe, a.value_bytes, q.tp,
                                  q.expert_tp > 0 ? q.expert_tp : q.tp, q.recompute_modules.moe_act);
  // Context parallelism (models/context_parallel.h) keeps the whole sequence's K and V rows (cp times
  // a rank's own) with the local qkv, and the attention output once more in its chunks' order.
  if (q.cp > 1) bytes += a.value_bytes * (q.cp * 2.0 * s.kv_heads * D / h + attention_out) * sbh / t;
  bytes += a.mask_bytes * 2.0 * sbh / rep;
  if (a.materialized_attention && q.recompute != Recompute::selective) {
    const double probs = s.heads * rows * static_cast<double>(attention_span(static_cast<std::int64_t>(q.seq))) / t;
    bytes += (2.0 * a.value_bytes + a.mask_bytes) * probs;
  }
  if (a.row_stats) {
    const double norms = norm_ == NormKind::layernorm ? 2.0 : 1.0;  // mean and rstd, or rstd
    bytes += 4.0 * (2.0 * norms * rows / rep + s.heads * rows / t);  // two norms; lse per head
  }
  return bytes;
}

// dqkv, d attention output, the MLP's two input gradients (split over tp),
// and seven of width h (the received output gradient, the two norms' input
// and output gradients, the residual sums), in units of rows.
double TransformerLayerDef::backward_working_bytes(const ActivationQuery& q) const {
  const LayerShape& s = shape_;
  const double rows = q.micro_batch * static_cast<double>(tokens(static_cast<std::int64_t>(q.seq))), t = q.tp;
  const double glu = s.activation == Activation::swiglu ? 2.0 : 1.0;
  const double D = static_cast<double>(s.dim());
  const double qkv = static_cast<double>(s.heads + 2 * s.kv_heads) * D;
  double width = (qkv + static_cast<double>(s.heads) * D + (glu + 1.0) * s.ffn) / t + 7.0 * s.width;
  // Context parallelism (models/context_parallel.cc). The all-gather works on the whole sequence's qkv
  // rows: the rebuilt input, its gradient and the second chunk's, and the K and V gradients by owner,
  // not all live at the peak at once: 1.5 qkv widths fit the measured peaks. The ring works a block
  // pair at a time and rotates only its own rows, so nothing grows with cp: the pair's qkv and dqkv
  // (half the rows each), the query-gradient scatter, and the K and V block sums in flight (incoming,
  // own, summed, sent), as for the all-gather not all live at the peak: one qkv width and 5·G·D fit
  // the measured peaks (cp 2 and 4, tp 2 × cp 2; tests/parallel/test_memory.cc).
  if (q.cp > 1)
    width += q.cp_ring ? (qkv + 5.0 * s.kv_heads * D) / t : q.cp * (1.5 * qkv + 2.0 * s.kv_heads * D) / t;
  if (s.moe.experts > 0) {
    // Per assignment: the experts' input gradients (F/etp, twice for SwiGLU's up) and the
    // gradient rows before and after the exchange (C each); the shared experts like a dense MLP.
    const double etp = q.expert_tp > 0 ? q.expert_tp : t, K = s.moe.top_k;
    width += K * ((glu + 1.0) * s.ffn / etp + 2.0 * s.width) - (glu + 1.0) * s.ffn / t;
    width += (glu + 1.0) * s.ffn * s.moe.shared_experts / t;
    // The recompute modules' outputs, made again for this backward: the experts' activation, and the
    // pre-MLP norm's (with the router's gathered copy under SP).
    if (q.recompute_modules.moe_act) width += K * s.ffn / etp;
    if (q.recompute_modules.layernorm) width += s.width * (q.sequence_parallel ? 1.0 + 1.0 / t : 1.0);
  }
  return q.layout.value_bytes * rows * width;
}

double TransformerLayerDef::deferred_weight_bytes(const ActivationQuery& q) const {
  const LayerShape& s = shape_;
  const double rows = q.micro_batch * static_cast<double>(tokens(static_cast<std::int64_t>(q.seq))), t = q.tp;
  const double glu = s.activation == Activation::swiglu ? 2.0 : 1.0;
  const double D = static_cast<double>(s.dim());
  const double rep = q.sequence_parallel ? t : 1.0;
  // dW = xᵀ·dy keeps x and dy. dy of every row: the qkv and MLP-up gradients (column-parallel, this
  // rank's columns) and the attention-out and MLP-down ones (row-parallel: the full width, gathered
  // under SP). x: the normed inputs of the column-parallel GEMMs (this rank's sequence shard under
  // SP, gathered again when W runs) and the attention output and MLP activation, this rank's columns.
  double width = static_cast<double>(s.heads + 2 * s.kv_heads) * D / t + s.width;  // dy
  width += s.width / rep + static_cast<double>(s.heads) * D / t;                     // x
  // The dense MLP, or only the shared experts: routed experts compute their dW in B.
  const double mlps = s.moe.experts == 0 ? 1.0 : s.moe.shared_experts;
  if (mlps > 0) width += (glu * s.ffn * mlps / t + s.width) + (s.width / rep + s.ffn * mlps / t);
  return q.layout.value_bytes * rows * width;
}

Status TransformerLayerDef::check_tensor_parallel(int tp) const {
  if (shape_.heads % tp != 0)
    return make_error("{}: heads {} are not divisible by tp {}; use a tp that divides the heads of every layer",
                      name_, shape_.heads, tp);
  if (shape_.kv_heads % tp != 0)
    return make_error("{}: kv_heads {} are not divisible by tp {}; use a tp that divides {}", name_, shape_.kv_heads,
                      tp, shape_.kv_heads);
  // Routed experts split over etp (validated with the expert plan); a dense MLP over tp.
  if (shape_.ffn % tp != 0 && shape_.moe.experts == 0)
    return make_error("{}: ffn width {} is not divisible by tp {}; use a tp that divides {}", name_, shape_.ffn, tp,
                      shape_.ffn);
  return ok_status();
}

std::unique_ptr<Block> TransformerLayerDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<TransformerLayer>(*this, ctx);
}

}  // namespace meshtrain
