// The decoding loop of `meshtrain generate`: the prompt runs once through
// the model (prefill, filling the KV cache), then each new token alone
// (decode), sampled from the logits of the last position
// (engine/generate/sampler.h), until one of three stops:
//  * max_new_tokens tokens were generated;
//  * the sequence (prompt and new tokens) fills the decoder's context (its
//    capacity: the model's seq_len), past which it has no position to run;
//  * the sampler drew the tokenizer's end-of-sequence id (not kept).
// Backend-independent: it issues work through a CachedDecoder only, and
// reads one row of logits per token.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/generate/sampler.h"
#include "models/cached_decoder.h"

namespace meshtrain {

enum class StopReason { max_new_tokens, context, end_of_sequence };
std::string_view stop_reason_name(StopReason r);  // "max_new_tokens", "context", "end_of_sequence"

struct GenerationOptions {
  int max_new_tokens = 64;  // >= 1
  SamplingOptions sampling;
  std::optional<std::int32_t> eos;  // the end-of-sequence id, if the vocabulary has one
  // Only ids below this are drawn (0: the model's whole vocabulary): a model
  // may have more rows than its tokenizer has pieces, and those ids have no text.
  int token_limit = 0;
  // Called with the new tokens so far after each one is kept (streaming
  // output); an Error stops generation with it.
  std::function<Status(std::span<const std::int32_t> tokens)> on_token;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // the new tokens, without the end-of-sequence id
  StopReason stop = StopReason::max_new_tokens;
  double prefill_s = 0;  // the prompt's forward and its first token
  double decode_s = 0;   // every later token
};

// An Error naming the problem for an empty prompt, one that leaves no room
// in the context for a new token, an id outside the vocabulary, max new
// tokens below 1, or bad sampling options.
Status check_generation(const CachedDecoder& d, std::span<const std::int32_t> prompt, const GenerationOptions& o);

// Clears the decoder's cache and generates from `prompt` (check_generation
// first). Errors: the backend's (a failed read), or a non-finite logit.
Result<GenerationResult> generate_tokens(CachedDecoder& d, std::span<const std::int32_t> prompt,
                                         const GenerationOptions& o);

}  // namespace meshtrain
