// The decoding loop (engine/generate/generation.h) on a randomly
// initialised tiny model: each of its three stops, what it refuses, and the
// same tokens for the same seed; the byte codec's continuation.
#include <catch2/catch.hpp>

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "engine/generate/generation.h"
#include "engine/generate/text_model.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;

namespace {

ModelSpec small_llama() {
  ModelSpec m = testing::llama_layers({});
  m.name = "loop-test";
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = 2, m.ffn = 48, m.vocab = 32, m.seq_len = 24;
  return m;
}

GenerationOptions greedy(int max_new_tokens) {
  GenerationOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling.temperature = 0;
  return o;
}

struct Fixture {
  CpuBackend b;
  CachedDecoder d{b, small_llama(), 24};
  // `scale` > 1: larger weights than GPT-2's 0.02, so that the logits differ clearly and greedy wanders.
  explicit Fixture(float scale = 20.f) {
    d.parameters().initialize(21);
    Tensor& values = d.parameters().values();
    b.scale(values, scale);
  }
};

const std::vector<std::int32_t> kPrompt = {4, 9, 1, 30};

}  // namespace

TEST_CASE("the loop stops at max new tokens, at the context, or at end-of-sequence", "[generate]") {
  Fixture f;
  auto ten = generate_tokens(f.d, kPrompt, greedy(10));
  REQUIRE(ten.ok());
  CHECK(ten->tokens.size() == 10);
  CHECK(ten->stop == StopReason::max_new_tokens);
  CHECK(f.d.length() == 4 + 9);  // the last token is sampled, never run

  // The context (24) holds the prompt and 20 new tokens; greedy is a prefix-stable path.
  auto all = generate_tokens(f.d, kPrompt, greedy(1000));
  REQUIRE(all.ok());
  CHECK(all->stop == StopReason::context);
  REQUIRE(all->tokens.size() == 20);
  CHECK(std::equal(ten->tokens.begin(), ten->tokens.end(), all->tokens.begin()));

  // End-of-sequence: the first token that is not earlier in the path stops it, unkept.
  std::size_t at = 1;
  while (std::find(all->tokens.begin(), all->tokens.begin() + static_cast<std::ptrdiff_t>(at), all->tokens[at]) !=
         all->tokens.begin() + static_cast<std::ptrdiff_t>(at))
    ++at;
  REQUIRE(at < all->tokens.size());
  GenerationOptions o = greedy(1000);
  o.eos = all->tokens[at];
  auto stopped = generate_tokens(f.d, kPrompt, o);
  REQUIRE(stopped.ok());
  CHECK(stopped->stop == StopReason::end_of_sequence);
  CHECK(stopped->tokens == std::vector<std::int32_t>(all->tokens.begin(), all->tokens.begin() + static_cast<std::ptrdiff_t>(at)));
}

TEST_CASE("sampled generation is fixed by its seed", "[generate]") {
  Fixture f(1.f);  // nearly uniform logits: another seed draws other tokens
  GenerationOptions o;
  o.max_new_tokens = 15;
  o.sampling.temperature = 1.5, o.sampling.top_p = 0.95, o.sampling.seed = 4;
  auto a = generate_tokens(f.d, kPrompt, o), b = generate_tokens(f.d, kPrompt, o);
  o.sampling.seed = 5;
  auto c = generate_tokens(f.d, kPrompt, o);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(a->tokens == b->tokens);
  CHECK(a->tokens != c->tokens);
}

TEST_CASE("only ids below the token limit are drawn", "[generate]") {
  Fixture f(1.f);
  GenerationOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 1, o.sampling.seed = 2;
  auto free = generate_tokens(f.d, kPrompt, o);
  o.token_limit = 5;
  auto limited = generate_tokens(f.d, kPrompt, o);
  REQUIRE((free.ok() && limited.ok()));
  CHECK(std::any_of(free->tokens.begin(), free->tokens.end(), [](std::int32_t t) { return t >= 5; }));
  CHECK(std::all_of(limited->tokens.begin(), limited->tokens.end(), [](std::int32_t t) { return t < 5; }));
  o.token_limit = 1;  // one id left: every draw is it
  auto one = generate_tokens(f.d, kPrompt, o);
  REQUIRE(one.ok());
  CHECK(one->tokens == std::vector<std::int32_t>(20, 0));
}

TEST_CASE("the loop refuses what it cannot run", "[generate]") {
  Fixture f;
  auto refused = [&](std::vector<std::int32_t> prompt, GenerationOptions o) {
    auto r = generate_tokens(f.d, prompt, o);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(refused({}, greedy(5)), Catch::Contains("the prompt is empty"));
  CHECK_THAT(refused(std::vector<std::int32_t>(24, 3), greedy(5)),
             Catch::Contains("the prompt is 24 tokens and the model's context is 24") && Catch::Contains("at most 23"));
  CHECK_THAT(refused({1, 32}, greedy(5)), Catch::Contains("prompt token 1 is id 32") && Catch::Contains("32"));
  CHECK_THAT(refused({1, -1}, greedy(5)), Catch::Contains("prompt token 1 is id -1"));
  CHECK_THAT(refused({1}, greedy(0)), Catch::Contains("--max-new-tokens"));
  GenerationOptions hot = greedy(5);
  hot.sampling.temperature = -1;
  CHECK_THAT(refused({1}, hot), Catch::Contains("--temperature"));
  // 23 tokens leave room for exactly one.
  auto last = generate_tokens(f.d, std::vector<std::int32_t>(23, 3), greedy(5));
  REQUIRE(last.ok());
  CHECK(last->tokens.size() == 1);
  CHECK(last->stop == StopReason::context);
}

TEST_CASE("bytes: every byte is a token, and back", "[generate]") {
  const TextCodec bytes = TextCodec::bytes();
  auto ids = bytes.encode("h\xc3\xa9!");
  REQUIRE(ids.ok());
  CHECK(*ids == std::vector<std::int32_t>{104, 0xc3, 0xa9, 33});
  const std::vector<std::int32_t> more = {32, 0xff};
  CHECK(*bytes.continuation(*ids, more) == std::string(" \xff"));
  CHECK_FALSE(bytes.eos().has_value());
  CHECK(bytes.describe() == "bytes");
}
