#include "models/vision_blocks.h"

#include "models/block_context.h"
#include "models/transformer_layer.h"

namespace meshtrain {

std::vector<std::int32_t> patch_order(int batch, int image, int patch) {
  const int grid = image / patch;
  std::vector<std::int32_t> order;
  order.reserve(static_cast<std::size_t>(batch) * image * image);
  for (int b = 0; b < batch; ++b)
    for (int py = 0; py < grid; ++py)
      for (int px = 0; px < grid; ++px)
        for (int iy = 0; iy < patch; ++iy)
          for (int ix = 0; ix < patch; ++ix)
            order.push_back((b * image + py * patch + iy) * image + px * patch + ix);
  return order;
}

std::vector<std::int32_t> merge_order(int batch, int grid) {
  // The reference implementation's concatenation order: x[0::2, 0::2],
  // x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2] (row offset first).
  constexpr int kDy[4] = {0, 1, 0, 1}, kDx[4] = {0, 0, 1, 1};
  const int out = (grid + 1) / 2;
  std::vector<std::int32_t> order;
  order.reserve(static_cast<std::size_t>(batch) * out * out * 4);
  for (int b = 0; b < batch; ++b)
    for (int y = 0; y < out; ++y)
      for (int x = 0; x < out; ++x)
        for (int k = 0; k < 4; ++k) {
          const int yy = 2 * y + kDy[k], xx = 2 * x + kDx[k];
          order.push_back(yy < grid && xx < grid ? (b * grid + yy) * grid + xx : -1);
        }
  return order;
}

namespace {

class PatchEmbedding : public Block {
 public:
  PatchEmbedding(const PatchEmbeddingDef& def, BlockContext& ctx) : def_(def), ctx_(ctx), m_(def.spec()) {}

  Tensor forward(const MicroBatch& mb, const Tensor&, std::unique_ptr<Block::Saved>* saved) override {
    Backend& b = ctx_.b;
    const std::int64_t B = mb.batch, grid = m_.patch_grid(), P = m_.patch, K = m_.channels, C = m_.hidden;
    const std::int64_t patches = B * grid * grid, T = m_.seq_len, N = B * T;
    auto s = std::make_unique<Saved>();
    // (B·I·I, K) pixel rows -> (B·S², P·P·K) patch rows: one gather.
    s->patches = b.empty(Shape{patches, P * P * K}, ctx_.act);
    Tensor patch_rows = s->patches.view(Shape{patches * P * P, K});
    b.gather_rows(mb.pixels.view(Shape{mb.pixels.numel() / K, K}), patch_index(mb.batch), patch_rows);
    Tensor emb;
    ctx_.linear(def_.param("embed.patch"), s->patches, emb, LinearKind::replicated);
    Tensor x;
    if (def_.class_token()) {
      // [patches | class token] as one source, then each image's row 0 from the
      // class token and rows 1.. from its patches.
      Tensor src = b.empty(Shape{patches + 1, C}, ctx_.act);
      Tensor src_patches = src.rows(0, patches), src_cls = src.rows(patches, 1);
      b.copy(emb, src_patches);
      b.copy(ctx_.params[def_.param("embed.cls")].value.view(Shape{1, C}), src_cls);
      emb = Tensor();
      x = b.empty(Shape{N, C}, ctx_.act);
      b.gather_rows(src, sequence_index(mb.batch), x);
      Tensor pe = b.empty(Shape{N, C}, ctx_.act);
      b.embedding_forward(ctx_.params[def_.param("embed.positions")].value, positions(mb.batch), pe, 0);
      b.add(x, pe, x);
    } else {
      s->emb = emb;
      ctx_.norm_forward(def_.param("embed.norm"), emb, x, s->mean, s->rstd);
    }
    if (ctx_.options.dropout > 0) b.dropout_forward(x, x, ctx_.whole_dropout(mb, -1, N, C));
    if (saved) *saved = std::move(s);
    return ctx_.sp ? ctx_.local_part(x) : x;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor& dout, float) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    const std::int64_t B = mb.batch, grid = m_.patch_grid(), C = m_.hidden;
    const std::int64_t patches = B * grid * grid, N = B * m_.seq_len;
    Tensor dx = ctx_.all_rows(dout, C);
    if (ctx_.options.dropout > 0) {
      Tensor d = b.empty(Shape{N, C}, ctx_.act);
      b.dropout_backward(dx, d, ctx_.whole_dropout(mb, -1, N, C));
      dx = d;
    }
    Tensor demb;
    if (def_.class_token()) {
      Tensor dpos = ctx_.params[def_.param("embed.positions")].grad, dcls = ctx_.params[def_.param("embed.cls")].grad;
      b.embedding_backward(dx, positions(mb.batch), dpos, 0);
      // The class token's rows sum into its gradient; the patch rows go back to the patches.
      b.embedding_backward(dx, class_rows(mb.batch), dcls, 0);
      demb = b.empty(Shape{patches, C}, ctx_.act);
      b.gather_rows(dx, patch_rows(mb.batch), demb);
    } else {
      ctx_.norm_backward(def_.param("embed.norm"), dx, s.emb, s.mean, s.rstd, demb, false);
    }
    ctx_.linear_backward(def_.param("embed.patch"), s.patches, demb, nullptr, LinearKind::replicated);
    return Tensor();
  }

 private:
  struct Saved : Block::Saved {
    Tensor patches, emb, mean, rstd;  // emb, mean, rstd: Swin's patch norm only
  };
  const Tensor& patch_index(int batch) {
    return ctx_.constant_ids(fmt::format("patches:{}", batch),
                             [&] { return patch_order(batch, m_.image_size, m_.patch); });
  }
  // ViT: sequence row b·T + 0 reads the class token (source row B·S²), row b·T + 1 + p patch b·S² + p.
  const Tensor& sequence_index(int batch) {
    return ctx_.constant_ids(fmt::format("sequence:{}", batch), [&] {
      const int grid = m_.patch_grid(), patches = grid * grid, T = m_.seq_len;
      std::vector<std::int32_t> index(static_cast<std::size_t>(batch) * T);
      for (int b = 0; b < batch; ++b)
        for (int t = 0; t < T; ++t)
          index[static_cast<std::size_t>(b * T + t)] = t == 0 ? batch * patches : b * patches + t - 1;
      return index;
    });
  }
  // The inverse of sequence_index's patch part: patch b·S² + p comes from row b·T + 1 + p.
  const Tensor& patch_rows(int batch) {
    return ctx_.constant_ids(fmt::format("patch_rows:{}", batch), [&] {
      const int grid = m_.patch_grid(), patches = grid * grid, T = m_.seq_len;
      std::vector<std::int32_t> index(static_cast<std::size_t>(batch) * patches);
      for (int b = 0; b < batch; ++b)
        for (int p = 0; p < patches; ++p) index[static_cast<std::size_t>(b * patches + p)] = b * T + 1 + p;
      return index;
    });
  }
  // (B·T): 0 on each image's class-token row, -1 (no row) elsewhere.
  const Tensor& class_rows(int batch) {
    return ctx_.constant_ids(fmt::format("class_rows:{}", batch), [&] {
      const int T = m_.seq_len;
      std::vector<std::int32_t> index(static_cast<std::size_t>(batch) * T, -1);
      for (int b = 0; b < batch; ++b) index[static_cast<std::size_t>(b * T)] = 0;
      return index;
    });
  }
  const Tensor& positions(int batch) { return ctx_.positions(batch, m_.seq_len); }

  const PatchEmbeddingDef& def_;
  BlockContext& ctx_;
  const ModelSpec& m_;
};

class PatchMerging : public Block {
 public:
  PatchMerging(const PatchMergingDef& def, BlockContext& ctx) : def_(def), ctx_(ctx) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x_in, std::unique_ptr<Block::Saved>* saved) override {
    Backend& b = ctx_.b;
    const std::int64_t C = def_.width(), out = def_.out_grid();
    const std::int64_t merged = static_cast<std::int64_t>(mb.batch) * out * out;
    const Tensor x = ctx_.all_rows(x_in, C);
    auto s = std::make_unique<Saved>();
    s->m = b.empty(Shape{merged, 4 * C}, ctx_.act);
    Tensor rows = s->m.view(Shape{merged * 4, C});
    b.gather_rows(x.view(Shape{x.numel() / C, C}), order(mb.batch, false), rows);
    ctx_.norm_forward(def_.name() + ".norm", s->m, s->n, s->mean, s->rstd);
    Tensor y;
    ctx_.linear(def_.name() + ".reduction", s->n, y, LinearKind::replicated);
    if (saved) *saved = std::move(s);
    return ctx_.sp ? ctx_.local_part(y) : y;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor& dout, float) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    const std::int64_t C = def_.width(), rows = static_cast<std::int64_t>(mb.batch) * def_.grid() * def_.grid();
    const Tensor dy = ctx_.all_rows(dout, 2 * C);
    Tensor dn, dm;
    ctx_.linear_backward(def_.name() + ".reduction", s.n, dy, &dn, LinearKind::replicated);
    ctx_.norm_backward(def_.name() + ".norm", dn, s.m, s.mean, s.rstd, dm, false);
    // Every input token went to exactly one merged row: the inverse map gathers its gradient back.
    Tensor dx = b.empty(Shape{rows, C}, ctx_.act);
    b.gather_rows(dm.view(Shape{dm.numel() / C, C}), order(mb.batch, true), dx);
    return ctx_.sp ? ctx_.local_part(dx) : dx;
  }

 private:
  struct Saved : Block::Saved {
    Tensor m, n, mean, rstd;  // merged rows (4C), their norm, its statistics
  };
  const Tensor& order(int batch, bool inverse) {
    return ctx_.constant_ids(fmt::format("merge:{}:{}:{}", batch, def_.grid(), inverse), [&] {
      auto o = merge_order(batch, def_.grid());
      return inverse ? inverse_order(o, static_cast<std::size_t>(batch) * def_.grid() * def_.grid()) : o;
    });
  }

  const PatchMergingDef& def_;
  BlockContext& ctx_;
};

class ClassifierHead : public Block {
 public:
  ClassifierHead(const ClassifierHeadDef& def, BlockContext& ctx) : def_(def), ctx_(ctx) {}

  Tensor forward(const MicroBatch& mb, const Tensor& x_in, std::unique_ptr<Block::Saved>* saved) override {
    Backend& b = ctx_.b;
    const std::int64_t B = mb.batch, T = def_.tokens(), C = def_.width();
    auto s = std::make_unique<Saved>();
    s->x = ctx_.all_rows(x_in, C);
    Tensor nf;
    ctx_.norm_forward("final_norm", s->x, nf, s->mean, s->rstd);
    s->pooled = b.empty(Shape{B, C}, ctx_.act);
    if (def_.class_token()) {
      b.gather_rows(nf, class_rows(B, false), s->pooled);
    } else {
      // The mean over an image's tokens: (B, 1, T) weights 1/T times its (T, C) rows.
      Tensor pooled3 = s->pooled.view(Shape{B, 1, C});
      b.batched_gemm(mean_weights(B), nf.view(Shape{B, T, C}), pooled3, GemmOp{});
    }
    nf = Tensor();
    ctx_.linear("head", s->pooled, s->logits, LinearKind::replicated);
    // Every tp rank holds the whole (B, Y) logits: the cross-entropy runs unsharded.
    Tensor loss_sum = ctx_.cross_entropy(s->logits, mb, 0, false, s->row_max, s->sumexp);
    if (saved) *saved = std::move(s);
    return loss_sum;
  }

  Tensor backward(const MicroBatch& mb, Block::Saved& saved, const Tensor&, float loss_scale) override {
    Backend& b = ctx_.b;
    Saved& s = static_cast<Saved&>(saved);
    const std::int64_t B = mb.batch, T = def_.tokens(), C = def_.width();
    Tensor dlogits = b.empty(s.logits.shape(), ctx_.act);
    b.cross_entropy_backward(s.logits, mb.targets, s.row_max, s.sumexp, 0, loss_scale, dlogits);
    Tensor dpooled;
    ctx_.linear_backward("head", s.pooled, dlogits, &dpooled, LinearKind::replicated);
    Tensor dnf = b.empty(Shape{B * T, C}, ctx_.act);
    if (def_.class_token()) {
      b.gather_rows(dpooled, class_rows(B, true), dnf);
    } else {
      Tensor dnf3 = dnf.view(Shape{B, T, C});
      b.batched_gemm(mean_weights(B), dpooled.view(Shape{B, 1, C}), dnf3, GemmOp{true, false});
    }
    Tensor dx;
    ctx_.norm_backward("final_norm", dnf, s.x, s.mean, s.rstd, dx, false);
    return ctx_.sp ? ctx_.local_part(dx) : dx;
  }

 private:
  struct Saved : Block::Saved {
    Tensor x, mean, rstd, pooled, logits, row_max, sumexp;
  };
  // (B) the class-token row of every image; inverse: (B·T) image b on row b·T, -1 elsewhere.
  const Tensor& class_rows(std::int64_t batch, bool inverse) {
    return ctx_.constant_ids(fmt::format("head_class:{}:{}", batch, inverse), [&] {
      const std::int64_t T = def_.tokens();
      std::vector<std::int32_t> index(static_cast<std::size_t>(inverse ? batch * T : batch), -1);
      for (std::int64_t b = 0; b < batch; ++b) {
        if (inverse) index[static_cast<std::size_t>(b * T)] = static_cast<std::int32_t>(b);
        else index[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b * T);
      }
      return index;
    });
  }
  const Tensor& mean_weights(std::int64_t batch) {
    const std::int64_t T = def_.tokens();
    return ctx_.constant_values(fmt::format("mean:{}:{}", batch, T), Shape{batch, 1, T}, ctx_.act, [&] {
      return std::vector<float>(static_cast<std::size_t>(batch * T), 1.f / static_cast<float>(T));
    });
  }

  const ClassifierHeadDef& def_;
  BlockContext& ctx_;
};

}  // namespace

void add_vit_encoder(const ModelSpec& vit, const std::string& prefix, const std::string& embed_module,
                     const std::string& layers_module, ModelBlocks& out) {
  add_block(out, std::make_unique<PatchEmbeddingDef>(vit, prefix), embed_module);
  LayerShape shape;
  shape.width = vit.hidden;
  shape.heads = shape.kv_heads = vit.heads;
  shape.ffn = vit.ffn;
  shape.causal = false;  // every patch reads every patch and the class token
  shape.activation = vit.activation;
  shape.bias = vit.bias;
  shape.tokens = vit.seq_len;
  for (int l = 0; l < vit.layers; ++l)
    add_block(out, std::make_unique<TransformerLayerDef>(l, prefix + "layers." + std::to_string(l), shape, vit.norm),
              layers_module);
}

std::vector<ParamInfo> PatchEmbeddingDef::parameters() const {
  ParamTableBuilder t(layer());
  const std::int64_t C = m_.hidden, P = m_.patch;
  t.linear(param("embed.patch"), P * P * m_.channels, C, TpSplit::replicated, true);
  if (class_token()) {
    t.add(param("embed.cls"), {1, C});
    t.add(param("embed.positions"), {m_.seq_len, C});
  } else {
    t.norm(param("embed.norm"), C, m_.norm);
  }
  return t.take();
}

BlockIo PatchEmbeddingDef::io(std::int64_t) const { return {0, 0, m_.seq_len, m_.hidden}; }

ForwardFlops PatchEmbeddingDef::flops(double samples, std::int64_t) const {
  const double grid = m_.patch_grid(), patch = m_.patch;
  ForwardFlops f;
  f.embedding = 2.0 * samples * grid * grid * (patch * patch * m_.channels) * m_.hidden;
  return f;
}

double PatchEmbeddingDef::activation_bytes(const ActivationQuery& q) const {
  // The patch rows (the GEMM's input); Swin also its patch norm's input and statistics.
  const double grid = m_.patch_grid(), patch = m_.patch, rows = q.micro_batch * grid * grid;
  const ActivationLayout& a = q.layout;
  double bytes = a.value_bytes * rows * patch * patch * m_.channels;
  if (!class_token()) {
    bytes += a.value_bytes * rows * m_.hidden;
    if (a.row_stats) bytes += 4.0 * 2.0 * rows;
  }
  return bytes;
}

std::unique_ptr<Block> PatchEmbeddingDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<PatchEmbedding>(*this, ctx);
}

std::vector<ParamInfo> PatchMergingDef::parameters() const {
  ParamTableBuilder t(layer());
  t.norm(name_ + ".norm", 4 * width_, norm_);
  t.linear(name_ + ".reduction", 4 * width_, 2 * width_, TpSplit::replicated, false);
  return t.take();
}

BlockIo PatchMergingDef::io(std::int64_t) const {
  return {static_cast<std::int64_t>(grid_) * grid_, width_, static_cast<std::int64_t>(out_grid()) * out_grid(),
          2 * width_};
}

ForwardFlops PatchMergingDef::flops(double samples, std::int64_t) const {
  ForwardFlops f;
  f.layers = 2.0 * samples * out_grid() * out_grid() * (4.0 * width_) * (2.0 * width_);
  return f;
}

double PatchMergingDef::activation_bytes(const ActivationQuery& q) const {
  // The merged rows and their norm (4C each, whole on every tp rank), and the norm's statistics.
  const double rows = q.micro_batch * out_grid() * out_grid();
  const ActivationLayout& a = q.layout;
  if (q.recompute == Recompute::full) return a.value_bytes * q.micro_batch * grid_ * grid_ * width_ / (q.sequence_parallel ? q.tp : 1);
  double bytes = a.value_bytes * 2.0 * rows * 4.0 * width_;
  if (a.row_stats) bytes += 4.0 * 2.0 * rows;
  return bytes;
}

std::unique_ptr<Block> PatchMergingDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<PatchMerging>(*this, ctx);
}

std::vector<ParamInfo> ClassifierHeadDef::parameters() const {
  ParamTableBuilder t(layer());
  t.norm("final_norm", width_, m_.norm);
  t.linear("head", width_, m_.classes, TpSplit::replicated, true);
  return t.take();
}

ForwardFlops ClassifierHeadDef::flops(double samples, std::int64_t) const {
  ForwardFlops f;
  f.head = 2.0 * samples * width_ * m_.classes;
  return f;
}

double ClassifierHeadDef::activation_bytes(const ActivationQuery& q) const {
  // The final norm's input (all rows, gathered under sequence parallelism) and
  // statistics, the pooled features, the logits and their row statistics.
  const double rows = q.micro_batch * tokens_, B = q.micro_batch;
  const ActivationLayout& a = q.layout;
  double bytes = a.value_bytes * (rows * width_ + B * width_ + B * m_.classes);
  if (a.row_stats) bytes += 4.0 * (2.0 * rows + 2.0 * B);
  return bytes;
}

std::unique_ptr<Block> ClassifierHeadDef::instantiate(BlockContext& ctx) const {
  return std::make_unique<ClassifierHead>(*this, ctx);
}

}  // namespace meshtrain
