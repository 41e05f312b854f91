// CachedDecoder: inference of a decoder-only language model (GPT with
// learned positions, Llama with RoPE, grouped-query attention, SwiGLU and
// RMSNorm, mixture-of-experts layers) one step at a time with a KV cache,
// written against backends/backend.h alone, so the same code runs on the cpu
// and cuda backends.
//
// Each transformer layer keeps a cache of (capacity, H + 2G, D) rows: the
// qkv rows of every position seen so far, keys and values (RoPE already
// applied) in the layout Backend::attention_forward reads. forward() runs
// n new tokens at positions [p, p + n), p = length(): their qkv rows are
// written into rows [p, p + n) of the cache, and attention runs over rows
// [0, p + n) with the query window [p, p + n) (AttentionOp::query_begin /
// query_rows: causal with an offset), so each new token reads the keys and
// values of every earlier position without recomputing them. The prompt
// runs once (prefill, n = its length), then each generated token alone
// (decode, n = 1). The cache keeps the query slots of its rows too (a
// token's q is only read in its own step): that costs H/(H + 2G) more
// memory than keys and values alone, and lets the one attention op of the
// training path serve prefill and decode on every backend.
//
// The layers are the training layers' math (models/transformer_layer.h,
// decoder_blocks.h) on one rank without tensor parallelism, dropout or
// recomputation; tests/generate checks each step's logits against a full
// forward of the whole sequence and the prefill's loss against ModelChunk.
// Mixture-of-experts layers route every token to its top-k experts without
// capacity drops: a drop depends on the other tokens of a micro-batch,
// which decoding one token at a time does not have.
//
// Legend: n new tokens, p their first position, C width, H/G query/kv
// heads, D head dim, V vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "models/block.h"
#include "models/block_context.h"
#include "models/model_spec.h"
#include "models/parameter_store.h"

namespace meshtrain {

class CachedDecoder {
 public:
  // An Error unless `m` is a decoder-only language model (not ViT, Swin or
  // VQA), naming what it is.
  static Status check_model(const ModelSpec& m);

  // Bytes of device memory a decoder holds for its lifetime: the parameters
  // (f32) and the caches; a step's activations come on top.
  static double resident_bytes(const ModelSpec& m, std::int64_t capacity);

  // A decoder for contexts of up to `capacity` tokens (at most m.seq_len
  // with learned positions). The parameters are allocated, not initialised:
  // fill parameters() (from a checkpoint, or initialize(seed)).
  CachedDecoder(Backend& b, const ModelSpec& m, std::int64_t capacity);
  ~CachedDecoder();
  CachedDecoder(const CachedDecoder&) = delete;
  CachedDecoder& operator=(const CachedDecoder&) = delete;

  Backend& backend() { return b_; }
  ParameterStore& parameters() { return params_; }
  const ModelSpec& model() const { return m_; }
  std::int64_t length() const { return length_; }  // positions in the cache
  std::int64_t capacity() const { return capacity_; }
  // Forgets every position (the cache's storage is kept).
  void clear() { length_ = 0; }

  // Runs `ids` (n >= 1, each in [0, V)) at positions [length(), length() + n)
  // and appends their keys and values to the cache. Returns the logits (n, V)
  // f32 of every new position when `every_row`, else (1, V) of the last one.
  // Misuse (no ids, past the capacity) aborts: callers check first.
  Tensor forward(std::span<const std::int32_t> ids, bool every_row);

 private:
  struct Layer;
  Tensor embed(std::span<const std::int32_t> ids);
  Tensor layer_forward(Layer& layer, const Tensor& x, std::int64_t n);
  Tensor head(const Tensor& x);

  Backend& b_;
  const ModelSpec m_;
  std::int64_t capacity_;
  std::int64_t length_ = 0;
  ModelBlocks defs_;
  ParameterStore params_;
  BlockContext ctx_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace meshtrain
