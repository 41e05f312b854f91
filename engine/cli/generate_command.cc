// `meshtrain generate`: samples text from a trained checkpoint with a KV
// cache (models/cached_decoder.h) on the cpu or cuda backend, encoding the
// prompt and decoding the result with the tokenizer the model was trained
// with (engine/generate/text_model.h).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "core/host_memory.h"
#include "core/input_file.h"
#include "core/names.h"
#include "engine/cli/backend_registry.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/generate/generation.h"
#include "engine/generate/text_model.h"

namespace meshtrain {

namespace {

struct GenerateFlags {
  std::string checkpoint, prompt, prompt_file, backend = "cpu";
  int max_new_tokens = 64;
  int threads = 0;
  SamplingOptions sampling;
  bool json = false;
};

Result<std::string> prompt_text(const GenerateFlags& f) {
  if (!f.prompt_file.empty()) return read_input_file(f.prompt_file, "prompt file");
  return f.prompt;
}

std::string stop_note(StopReason r, const GenerationOptions& o, std::int64_t context) {
  switch (r) {
    case StopReason::max_new_tokens: return fmt::format("stopped after --max-new-tokens {}", o.max_new_tokens);
    case StopReason::context: return fmt::format("stopped at the model's context of {} tokens", context);
    case StopReason::end_of_sequence: return "stopped at the tokenizer's end-of-sequence token";
  }
  return {};
}

void print_json(const GenerateFlags& f, const TrainedModel& t, std::span<const std::int32_t> prompt,
                const GenerationResult& r, const std::string& text) {
  const double decoded = static_cast<double>(r.tokens.size() > 1 ? r.tokens.size() - 1 : 0);
  nlohmann::json j = {{"model", t.model.name},
                      {"step", t.step},
                      {"backend", f.backend},
                      {"tokenizer", t.codec.describe()},
                      {"prompt_tokens", prompt.size()},
                      {"tokens", r.tokens},
                      {"new_tokens", r.tokens.size()},
                      {"text", text},
                      {"stop", stop_reason_name(r.stop)},
                      {"prefill_s", r.prefill_s},
                      {"decode_s", r.decode_s},
                      {"decode_tokens_per_s", r.decode_s > 0 ? decoded / r.decode_s : 0.0}};
  // Bytes a byte-level model made need not be UTF-8: JSON gets U+FFFD for them.
  fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Prints each token's text as it comes: the continuation decoded so far,
// less what was printed (a tokenizer may join pieces only once both are there).
class StreamPrinter {
 public:
  StreamPrinter(const TextCodec& codec, std::span<const std::int32_t> prompt) : codec_(codec), prompt_(prompt) {}
  Status operator()(std::span<const std::int32_t> tokens) {
    MT_ASSIGN(const std::string text, codec_.continuation(prompt_, tokens));
    if (!text.starts_with(printed_)) return ok_status();  // rewritten: wait for the text to settle
    std::fwrite(text.data() + printed_.size(), 1, text.size() - printed_.size(), stdout);
    std::fflush(stdout);
    printed_ = text;
    return ok_status();
  }
  // The rest of the final continuation, where the stream had to wait.
  void finish(const std::string& text) {
    if (text.starts_with(printed_)) std::fwrite(text.data() + printed_.size(), 1, text.size() - printed_.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  const TextCodec& codec_;
  std::span<const std::int32_t> prompt_;
  std::string printed_;
};

Status run_generate(const GenerateFlags& f) {
  MT_TRY(check_backend_name(f.backend));
  if (!f.prompt.empty() && !f.prompt_file.empty()) return make_error("give --prompt or --prompt-file, not both");
  MT_ASSIGN(const std::string text, prompt_text(f));
  MT_ASSIGN(const TrainedModel t, load_trained_model(f.checkpoint));
  MT_ASSIGN(const std::vector<std::int32_t> prompt, t.codec.encode(text));
  GenerationOptions o{f.max_new_tokens, f.sampling, t.codec.eos(), t.codec.vocab(), {}};
  // The cache holds what this run can reach: the prompt and its new tokens, within the model's context.
  const std::int64_t capacity = std::min<std::int64_t>(
      t.model.seq_len, static_cast<std::int64_t>(prompt.size()) + std::max(f.max_new_tokens, 1));
  if (f.backend == "cpu")
    MT_TRY(check_host_memory(CachedDecoder::resident_bytes(t.model, capacity),
                             fmt::format("the model's parameters and a KV cache of {} positions", capacity),
                             "lower --max-new-tokens or shorten the prompt, or use a machine with more memory"));
  MT_ASSIGN(std::unique_ptr<Backend> b, make_backend({.name = f.backend, .threads = f.threads}));
  CachedDecoder decoder(*b, t.model, capacity);
  MT_TRY(check_generation(decoder, prompt, o));
  MT_TRY(load_parameters(decoder, t));
  StreamPrinter stream(t.codec, prompt);
  if (!f.json) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    o.on_token = std::ref(stream);
  }
  MT_ASSIGN(const GenerationResult r, generate_tokens(decoder, prompt, o));
  MT_ASSIGN(const std::string continuation, t.codec.continuation(prompt, r.tokens));
  if (f.json) {
    print_json(f, t, prompt, r, continuation);
    return ok_status();
  }
  stream.finish(continuation);
  const double rate = r.decode_s > 0 && r.tokens.size() > 1 ? static_cast<double>(r.tokens.size() - 1) / r.decode_s : 0;
  fmt::print(stderr, "[{} prompt tokens, {} new; {}; prefill {:.1f} ms, decode {:.1f} tokens/s on {}]\n",
             prompt.size(), r.tokens.size(), stop_note(r.stop, o, t.model.seq_len), 1e3 * r.prefill_s, rate,
             f.backend);
  return ok_status();
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* sub = app.add_subcommand("generate", "sample text from a trained checkpoint (greedy, temperature, "
                                                 "top-k, top-p) with a KV cache");
  sub->add_option("--checkpoint", f->checkpoint, "the --checkpoint DIR of a `meshtrain train` run")->required();
  sub->add_option("--prompt", f->prompt, "the text to continue");
  sub->add_option("--prompt-file", f->prompt_file, "a file holding the text to continue (in place of --prompt)");
  sub->add_option("--max-new-tokens", f->max_new_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(int_in({1, 1 << 24}));
  sub->add_option("--temperature", f->sampling.temperature, "softmax temperature; 0 is greedy")
      ->capture_default_str()
      ->check(real_in({0, 1e6}));
  sub->add_option("--top-k", f->sampling.top_k, "sample among the k most probable tokens; 0: all")
      ->capture_default_str()
      ->check(int_in({0, 1 << 24}));
  sub->add_option("--top-p", f->sampling.top_p,
                  "sample among the most probable tokens whose probabilities sum to p (nucleus); 1: all")
      ->capture_default_str()
      ->check(real_in({0, 1, true, false}));
  sub->add_option("--seed", f->sampling.seed, "seed of the draws: the same seed gives the same text")
      ->capture_default_str()
      ->check(uint64_up_to(std::numeric_limits<std::uint64_t>::max()));
  sub->add_option("--backend", f->backend, "cpu or cuda")->capture_default_str();
  sub->add_option("--threads", f->threads, "cpu backend threads; 0: every core this process may use")
      ->capture_default_str()
      ->check(int_in({0, 4096}));
  sub->add_flag("--json", f->json, "print one JSON object: tokens, text, why it stopped, timings");
  return {sub, [f] { return run_generate(*f); }};
}

}  // namespace meshtrain
