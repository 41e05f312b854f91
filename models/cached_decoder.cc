#include "models/cached_decoder.h"

#include <cmath>
#include <cstdlib>
#include <iterator>
#include <numeric>

#include <fmt/format.h>

#include "models/moe_layer.h"
#include "models/transformer_layer.h"

namespace meshtrain {

struct CachedDecoder::Layer {
  const TransformerLayerDef* def = nullptr;
  std::unique_ptr<MoeMlp> moe;  // null: a dense MLP
  Tensor cache;                 // (capacity, (H + 2G) · D): qkv rows of the positions seen
  std::string name(const char* what) const { return def->name() + "." + what; }
};

namespace {

std::vector<ParamInfo> all_parameters(const ModelBlocks& defs) {
  std::vector<ParamInfo> out;
  for (const auto& d : defs) {
    std::vector<ParamInfo> p = d->parameters();
    std::move(p.begin(), p.end(), std::back_inserter(out));
  }
  return out;
}

TensorParallel single_rank(const Backend& b) { return TensorParallel{Group{0, {b.rank()}}, 0, 1}; }

[[noreturn]] void misuse(const std::string& what) {
  fmt::print(stderr, "CachedDecoder misuse: {}\n", what);
  std::abort();
}

}  // namespace

Status CachedDecoder::check_model(const ModelSpec& m) {
  if (m.family == ModelFamily::decoder) return ok_status();
  const char* what = m.vqa() ? "a visual question answering model (it answers questions about images)"
                             : "an image classifier";
  return make_error("model '{}' is {} ({}), not a text decoder: generate samples text from decoder-only language "
                    "models (GPT, Llama, mixture of experts) trained on text",
                    m.name, what, family_name(m.family));
}

double CachedDecoder::resident_bytes(const ModelSpec& m, std::int64_t capacity) {
  double elements = 0;
  for (const auto& d : model_blocks(m)) {
    for (const ParamInfo& p : d->parameters()) elements += static_cast<double>(p.numel());
    if (const auto* layer = dynamic_cast<const TransformerLayerDef*>(d.get())) {
      const LayerShape& s = layer->shape();
      elements += static_cast<double>(capacity) * (s.heads + 2 * s.kv_heads) * s.dim();
    }
  }
  return elements * static_cast<double>(dtype_size(DType::f32));
}

CachedDecoder::CachedDecoder(Backend& b, const ModelSpec& m, std::int64_t capacity)
    : b_(b),
      m_(m),
      capacity_(capacity),
      defs_(model_blocks(m_)),
      // Values only: inference keeps no gradients.
      params_(b, m_, all_parameters(defs_), ShardCoord{}, ParameterStorage{true, false, DType::f32}),
      ctx_(b, m_, params_, single_rank(b), ChunkOptions{}) {
  if (Status s = check_model(m_); !s.ok()) misuse(s.error().message());
  if (capacity_ < 1 || (m_.position == PositionKind::learned && capacity_ > m_.seq_len))
    misuse(fmt::format("capacity {} outside 1..{} (the learned position table)", capacity_, m_.seq_len));
  for (const auto& d : defs_) {
    const auto* def = dynamic_cast<const TransformerLayerDef*>(d.get());
    if (!def) continue;  // the embedding and the head
    auto layer = std::make_unique<Layer>();
    layer->def = def;
    const LayerShape& s = def->shape();
    if (s.moe.experts > 0) {
      MoeShape dropless = s.moe;
      dropless.capacity_factor = 0.f;
      layer->moe = std::make_unique<MoeMlp>(ctx_, def->name() + ".moe", s.width, s.ffn, s.activation, dropless);
    }
    layer->cache = b_.empty(Shape{capacity_, static_cast<std::int64_t>(s.heads + 2 * s.kv_heads) * s.dim()});
    layers_.push_back(std::move(layer));
  }
}

CachedDecoder::~CachedDecoder() = default;

Tensor CachedDecoder::forward(std::span<const std::int32_t> ids, bool every_row) {
  const auto n = static_cast<std::int64_t>(ids.size());
  if (n == 0) misuse("forward without ids");
  if (length_ + n > capacity_)
    misuse(fmt::format("{} tokens at position {} pass the capacity {}", n, length_, capacity_));
  Tensor x = embed(ids);
  for (auto& layer : layers_) x = layer_forward(*layer, x, n);
  length_ += n;
  return head(every_row ? x : x.rows(n - 1, 1));
}

Tensor CachedDecoder::embed(std::span<const std::int32_t> ids) {
  const auto n = static_cast<std::int64_t>(ids.size());
  Tensor id_tensor = b_.empty(Shape{n}, DType::i32);
  b_.write(id_tensor, ids);
  Tensor x = b_.empty(Shape{n, m_.hidden});
  b_.embedding_forward(params_["embed.tokens"].value, id_tensor, x, 0);
  if (m_.position == PositionKind::learned) {
    std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
    std::iota(positions.begin(), positions.end(), static_cast<std::int32_t>(length_));
    Tensor pos = b_.empty(Shape{n}, DType::i32);
    b_.write(pos, positions);
    Tensor pe = b_.empty(Shape{n, m_.hidden});
    b_.embedding_forward(params_["embed.positions"].value, pos, pe, 0);
    b_.add(x, pe, x);
  }
  return x;
}

Tensor CachedDecoder::layer_forward(Layer& layer, const Tensor& x, std::int64_t n) {
  const LayerShape& s = layer.def->shape();
  const int H = s.heads, G = s.kv_heads, D = s.dim();
  const std::int64_t p = length_, C = s.width;
  Tensor n1, mean1, rstd1, qkv;
  ctx_.norm_forward(layer.name("norm1"), x, n1, mean1, rstd1);
  ctx_.linear(layer.name("attn.qkv"), n1, qkv, LinearKind::column);
  // The new rows rotate by their own positions, then join the cache.
  if (s.rope) {
    Tensor qkv4 = qkv.view(Shape{1, n, H + 2 * G, D});
    b_.rope(qkv4, H + 2 * G, H + G, s.rope_theta, false, p);
  }
  Tensor slots = layer.cache.rows(p, n);
  b_.copy(qkv, slots);
  AttentionOp op;
  op.heads = H, op.kv_heads = G, op.head_dim = D;
  op.scale = 1.f / std::sqrt(static_cast<float>(D));
  op.causal = true;
  op.query_begin = p, op.query_rows = n;  // the new rows, each reading every key up to its own position
  Tensor attn = b_.empty(Shape{n, static_cast<std::int64_t>(H) * D});
  Tensor lse = b_.empty(Shape{1, H, n});
  Tensor attn4 = attn.view(Shape{1, n, H, D});
  b_.attention_forward(layer.cache.rows(0, p + n).view(Shape{1, p + n, H + 2 * G, D}), attn4, lse, op);
  Tensor proj;
  ctx_.linear(layer.name("attn.out"), attn, proj, LinearKind::row);
  Tensor x2 = b_.empty(Shape{n, C});
  b_.add(x, proj, x2);
  Tensor n2, mean2, rstd2, down;
  ctx_.norm_forward(layer.name("norm2"), x2, n2, mean2, rstd2);
  if (layer.moe) {
    MicroBatch mb;
    mb.batch = 1, mb.seq = static_cast<int>(n);
    down = layer.moe->forward(mb, n, n2, nullptr).run();
  } else {
    Tensor up;
    ctx_.linear(layer.name("mlp.up"), n2, up, LinearKind::column);
    Tensor act = b_.empty(Shape{n, s.ffn});
    if (s.activation == Activation::gelu) b_.gelu_forward(up, act);
    else b_.swiglu_forward(up, act);
    ctx_.linear(layer.name("mlp.down"), act, down, LinearKind::row);
  }
  Tensor out = b_.empty(Shape{n, C});
  b_.add(x2, down, out);
  return out;
}

Tensor CachedDecoder::head(const Tensor& x) {
  Tensor nf, meanf, rstdf;
  ctx_.norm_forward("final_norm", x, nf, meanf, rstdf);
  const std::int64_t rows = nf.shape()[0];
  Tensor logits = b_.empty(Shape{rows, m_.vocab});
  if (m_.tied_embeddings) b_.gemm(nf, params_["embed.tokens"].value, logits, GemmOp{false, true, 1.f, 0.f, {}});
  else b_.gemm(nf, params_["head"].value, logits, GemmOp{false, false, 1.f, 0.f, {}});
  return logits;
}

}  // namespace meshtrain
