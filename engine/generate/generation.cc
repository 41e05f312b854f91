#include "engine/generate/generation.h"

#include <algorithm>
#include <chrono>

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::max_new_tokens: return "max_new_tokens";
    case StopReason::context: return "context";
    case StopReason::end_of_sequence: return "end_of_sequence";
  }
  return "?";
}

Status check_generation(const CachedDecoder& d, std::span<const std::int32_t> prompt, const GenerationOptions& o) {
  MT_TRY(check_sampling(o.sampling));
  if (o.max_new_tokens < 1) return make_error("--max-new-tokens must be >= 1, got {}", o.max_new_tokens);
  if (o.token_limit < 0) return make_error("the token limit must be >= 0, got {}", o.token_limit);
  if (prompt.empty()) return make_error("the prompt is empty; give --prompt TEXT with at least one token");
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n >= d.capacity())
    return make_error("the prompt is {} tokens and the model's context is {}: it leaves no room for a new token; "
                      "shorten the prompt to at most {} tokens",
                      n, d.capacity(), d.capacity() - 1);
  const int vocab = d.model().vocab;
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return make_error("prompt token {} is id {}, outside the model's vocabulary of {}", i, prompt[i], vocab);
  return ok_status();
}

Result<GenerationResult> generate_tokens(CachedDecoder& d, std::span<const std::int32_t> prompt,
                                         const GenerationOptions& o) {
  MT_TRY(check_generation(d, prompt, o));
  Backend& b = d.backend();
  GenerationResult r;
  const Sampler sampler(o.sampling);
  std::vector<float> logits(static_cast<std::size_t>(d.model().vocab));
  const std::size_t drawable = o.token_limit > 0 ? std::min(logits.size(), static_cast<std::size_t>(o.token_limit))
                                                 : logits.size();
  d.clear();
  const auto start = Clock::now();
  Tensor row = d.forward(prompt, false);
  for (std::uint64_t step = 0;; ++step) {
    MT_TRY(b.read(row, logits));  // BLOCKS: the only wait of a step
    MT_ASSIGN(const std::int32_t token, sampler.next(std::span<const float>(logits).first(drawable), step));
    if (step == 0) r.prefill_s = seconds_since(start);
    if (o.eos && token == *o.eos) {
      r.stop = StopReason::end_of_sequence;
      break;
    }
    r.tokens.push_back(token);
    if (o.on_token) MT_TRY(o.on_token(r.tokens));
    if (static_cast<int>(r.tokens.size()) == o.max_new_tokens) {
      r.stop = StopReason::max_new_tokens;
      break;
    }
    if (d.length() + 1 == d.capacity()) {  // the new token fills the context: nothing may follow it
      r.stop = StopReason::context;
      break;
    }
    row = d.forward(std::span<const std::int32_t>(&r.tokens.back(), 1), false);
  }
  r.decode_s = seconds_since(start) - r.prefill_s;
  return r;
}

}  // namespace meshtrain
