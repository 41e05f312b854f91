// A trained text model as `meshtrain generate` reads it from a checkpoint
// (engine/checkpoint/checkpoint.h): the model spec, its full parameters
// ("params/<name>", plan-independent, so a model trained under any plan
// loads onto one device), and the codec between text and its tokens: the
// SentencePiece model the run was trained with (`train --tokenizer`, copied
// into the checkpoint), or bytes for a byte-level model (vocab 256) trained
// without one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/data/tokenizer.h"
#include "models/cached_decoder.h"
#include "models/model_spec.h"

namespace meshtrain {

// Text to tokens and back: a tokenizer's, or one token per byte.
class TextCodec {
 public:
  static TextCodec bytes() { return TextCodec(); }
  static TextCodec sentencepiece(Tokenizer t) { return TextCodec(std::move(t)); }

  Result<std::vector<std::int32_t>> encode(std::string_view text) const;
  Result<std::string> decode(std::span<const std::int32_t> ids) const;
  // The text `tokens` add after `prompt`: decoded together and the prompt's
  // own text cut off, as a tokenizer decodes a piece's leading space
  // ("▁brown") only after other text, never at the start.
  Result<std::string> continuation(std::span<const std::int32_t> prompt, std::span<const std::int32_t> tokens) const;
  // The tokenizer's end-of-sequence id; none for bytes.
  std::optional<std::int32_t> eos() const;
  // Ids that have text: the tokenizer's pieces, or 256 bytes.
  int vocab() const;
  // "bytes", or the tokenizer's path.
  std::string describe() const;

 private:
  TextCodec() = default;
  explicit TextCodec(Tokenizer t) : tokenizer_(std::move(t)) {}
  std::optional<Tokenizer> tokenizer_;
};

struct TrainedModel {
  std::string dir;
  ModelSpec model;
  std::int64_t step = 0;  // the training step the checkpoint holds
  std::map<std::string, std::vector<float>> parameters;  // by parameter name, full tensors
  TextCodec codec = TextCodec::bytes();
};

// Reads and verifies the checkpoint in `dir`. Refused, naming the problem: a
// missing directory or one without a checkpoint, a damaged checkpoint, a
// model that is not a text decoder (ViT, Swin, VQA), a model whose
// vocabulary is not bytes but that was trained without --tokenizer, and,
// before it is read, a payload that would not fit this machine's memory.
Result<TrainedModel> load_trained_model(const std::string& dir);

// Writes the trained parameters into the decoder's store (each present with
// its full size, or an Error naming it).
Status load_parameters(CachedDecoder& d, const TrainedModel& t);

}  // namespace meshtrain
