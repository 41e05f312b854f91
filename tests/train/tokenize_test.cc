// SentencePiece tokenizers (engine/data/tokenizer.h, `meshtrain tokenize`,
// `train --tokenizer`): a BPE and a unigram model trained on a corpus the test
// writes round-trip it; the token file is what the token dataset reads; a
// model of the tokenizer's vocabulary trains on it and its checkpoint keeps
// the tokenizer; bad input is refused naming the problem.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/token_dataset.h"
#include "engine/data/tokenizer.h"
#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

fs::path scratch(const std::string& name) { return testing::scratch_path("tokenize-test", name); }

using testing::read_file;

std::string write_file(const std::string& name, const std::string& text) {
  const fs::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// About 6 KB of English-like text that NFKC leaves as it is: sentences of
// words made of syllables (seeded, so every run writes the same), capitals,
// commas and full stops, a blank line every 9 sentences and a double space now
// and then, so that spaces and line breaks are part of what must survive.
std::string corpus_text() {
  static const char* syllables[] = {"ta", "ren", "mo", "li", "ka", "the", "ver", "on", "sa", "di", "nu", "pre",
                                    "ex", "al", "ing", "so", "mer", "co", "un", "ri", "ba", "tes", "lo", "gar"};
  constexpr std::size_t kSyllables = sizeof syllables / sizeof syllables[0];
  std::uint64_t s = 20240520;
  auto next = [&s](std::uint64_t n) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (s >> 33) % n;
  };
  std::string text;
  for (int sentence = 0; text.size() < 6000; ++sentence) {
    const std::uint64_t words = 5 + next(8);
    for (std::uint64_t w = 0; w < words; ++w) {
      std::string word;
      for (std::uint64_t k = 0, n = 1 + next(3); k < n; ++k) word += syllables[next(kSyllables)];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      text += word;
      if (w + 1 < words) text += next(9) == 0 ? ", " : next(23) == 0 ? "  " : " ";
    }
    text += ".\n";
    if (sentence % 9 == 8) text += "\n";
  }
  return text;
}

const std::string& corpus_path() {
  static const std::string path = write_file("corpus.txt", corpus_text());
  return path;
}

std::string trained_model(const std::string& name, int vocab, TokenizerType type) {
  const std::string prefix = scratch(name).string();
  const Status s = train_tokenizer({corpus_path(), prefix, vocab, type, 7, 1.0});
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
  return prefix + ".model";
}

// The BPE model of 400 pieces most tests share.
const std::string& bpe400() {
  static const std::string path = trained_model("bpe400", 400, TokenizerType::bpe);
  return path;
}

}  // namespace

TEST_CASE("a BPE tokenizer round-trips its corpus into a token file the dataset reads") {
  auto t = Tokenizer::load(bpe400());
  REQUIRE(t.ok());
  CHECK(t->vocab_size() == 400);
  const std::string text = corpus_text();
  auto ids = t->encode(text);
  REQUIRE(ids.ok());
  // Pieces longer than one character: fewer than a token per two bytes.
  CHECK(ids->size() * 2 < text.size());
  for (std::uint32_t id : *ids) REQUIRE(id < 400u);
  auto back = t->decode(*ids);
  REQUIRE(back.ok());
  CHECK(*back == text);

  const std::string file = scratch("corpus.bin").string();
  REQUIRE(write_llmc_tokens(file, *ids, 400).ok());
  CHECK(fs::file_size(file) == kLlmcHeaderBytes + 2 * ids->size());  // uint16: the vocabulary fits
  const DataSource source = identify_data(file);
  REQUIRE(source.format == DataFormat::llmc);
  auto dataset = load_token_dataset(source, 16);
  REQUIRE(dataset.ok());
  REQUIRE(dataset->tokens.size() == ids->size());
  CHECK(dataset->tokens.width() == 2);
  for (std::size_t i = 0; i < ids->size(); ++i) REQUIRE(dataset->tokens[i] == (*ids)[i]);
  auto read = read_llmc_tokens(file);
  REQUIRE(read.ok());
  CHECK(*read == *ids);
}

TEST_CASE("a vocabulary past 65536 writes uint32 ids") {
  const std::vector<std::uint32_t> ids = {0, 65535, 65536, 70000, 3};
  const std::string file = scratch("wide.bin").string();
  REQUIRE(write_llmc_tokens(file, ids, 70001).ok());
  CHECK(fs::file_size(file) == kLlmcHeaderBytes + 4 * ids.size());
  auto read = read_llmc_tokens(file);
  REQUIRE(read.ok());
  CHECK(*read == ids);
  const Status past = write_llmc_tokens(file, ids, 70000);
  REQUIRE_FALSE(past.ok());
  CHECK_THAT(past.error().message(), Catch::Contains("id 70000"));
}

TEST_CASE("tokenizer training is deterministic, and unigram models round-trip too") {
  // The model records its trainer's settings, paths included: train to one prefix twice.
  const std::string first = read_file(trained_model("det", 400, TokenizerType::bpe));
  CHECK(read_file(trained_model("det", 400, TokenizerType::bpe)) == first);
  const std::string unigram = trained_model("unigram300", 300, TokenizerType::unigram);
  auto t = Tokenizer::load(unigram);
  REQUIRE(t.ok());
  CHECK(t->vocab_size() == 300);
  const std::string text = corpus_text();
  auto ids = t->encode(text);
  REQUIRE(ids.ok());
  auto back = t->decode(*ids);
  REQUIRE(back.ok());
  CHECK(*back == text);
}

TEST_CASE("tokenizer refusals name the problem and the fix") {
  SECTION("a vocabulary larger than the corpus allows") {
    const Status s = train_tokenizer({corpus_path(), scratch("huge").string(), 100000, TokenizerType::bpe, 1, 1.0});
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains("Vocabulary size too high") && Catch::Contains("--vocab-size"));
  }
  SECTION("a missing corpus") {
    const Status s = train_tokenizer({scratch("absent.txt").string(), scratch("m").string(), 300,
                                      TokenizerType::bpe, 1, 1.0});
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains("does not exist") && Catch::Contains("--input"));
  }
  SECTION("a file that is not a SentencePiece model") {
    auto t = Tokenizer::load(corpus_path());
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(t.error().message(), Catch::Contains("is not a SentencePiece model"));
    auto empty = Tokenizer::load(write_file("empty.model", ""));
    REQUIRE_FALSE(empty.ok());
    CHECK_THAT(empty.error().message(), Catch::Contains("is not a SentencePiece model"));
  }
  SECTION("token files that are missing or not llm.c's") {
    auto missing = read_llmc_tokens(scratch("nope.bin").string());
    REQUIRE_FALSE(missing.ok());
    CHECK_THAT(missing.error().message(), Catch::Contains("does not exist"));
    auto text = read_llmc_tokens(corpus_path());
    REQUIRE_FALSE(text.ok());
    CHECK_THAT(text.error().message(), Catch::Contains("is not an llm.c token file"));
  }
  SECTION("ids past the tokenizer's pieces") {
    auto t = Tokenizer::load(bpe400());
    REQUIRE(t.ok());
    const std::vector<std::uint32_t> ids = {5, 6, 400};
    auto text = t->decode(ids);
    REQUIRE_FALSE(text.ok());
    CHECK_THAT(text.error().message(), Catch::Contains("token 2 is id 400") && Catch::Contains("400 pieces"));
  }
}

TEST_CASE("meshtrain tokenize: train, encode and decode from the command line") {
  const std::string prefix = scratch("cli").string();
  auto trained = run_meshtrain("tokenize train --input " + corpus_path() + " --model-prefix " + prefix +
                               " --vocab-size 350 --type bpe");
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  CHECK_THAT(trained.out, Catch::Contains("350 pieces"));
  CHECK(fs::exists(prefix + ".vocab"));
  const std::string tokens = scratch("cli.bin").string(), decoded = scratch("cli.txt").string();
  auto encoded = run_meshtrain("tokenize encode --model " + prefix + ".model --input " + corpus_path() + " --out " +
                               tokens);
  INFO(encoded.out);
  REQUIRE(encoded.status == 0);
  CHECK_THAT(encoded.out, Catch::Contains("tokens (uint16)") && Catch::Contains("bytes/token"));
  auto back = run_meshtrain("tokenize decode --model " + prefix + ".model --input " + tokens + " --out " + decoded);
  INFO(back.out);
  REQUIRE(back.status == 0);
  CHECK(read_file(decoded) == corpus_text());

  auto same = run_meshtrain("tokenize encode --model " + prefix + ".model --input " + corpus_path() + " --out " +
                            corpus_path());
  CHECK(same.status != 0);
  CHECK_THAT(same.out, Catch::Contains("--out") && Catch::Contains("--input"));
  CHECK(read_file(corpus_path()) == corpus_text());
}

TEST_CASE("train --tokenizer: the checkpoint keeps the tokenizer the model was trained with") {
  auto t = Tokenizer::load(bpe400());
  REQUIRE(t.ok());
  auto ids = t->encode(corpus_text());
  REQUIRE(ids.ok());
  const std::string data = scratch("train.bin").string();
  REQUIRE(write_llmc_tokens(data, *ids, 400).ok());
  const std::string model = write_file("vocab400.json",
                                       R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 400, "seq_len": 64})");
  const fs::path ckpt = scratch("ckpt");
  const std::string run = "train --model " + model + " --data " + data +
                          " --seq-len 16 --micro-batch 4 --lr 3e-3 --warmup 1 --quiet --checkpoint " + ckpt.string();
  auto trained = run_meshtrain(run + " --steps 3 --tokenizer " + bpe400());
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  const auto manifest = nlohmann::json::parse(read_file(ckpt / "manifest.json"));
  REQUIRE(manifest.contains("tokenizer"));
  const auto& recorded = manifest["tokenizer"];
  CHECK(recorded["vocab"] == 400);
  CHECK(recorded["source"] == bpe400());
  const fs::path copy = ckpt / recorded["file"].get<std::string>();
  CHECK(read_file(copy) == read_file(bpe400()));
  CHECK(recorded["bytes"] == fs::file_size(bpe400()));

  // Resuming without --tokenizer keeps the recorded one; with another file it is refused.
  auto resumed = run_meshtrain(run + " --steps 4 --resume");
  INFO(resumed.out);
  REQUIRE(resumed.status == 0);
  const auto after = nlohmann::json::parse(read_file(ckpt / "manifest.json"));
  CHECK(after["step"] == 4);
  CHECK(after["tokenizer"] == recorded);
  const std::string other = trained_model("unigram300", 300, TokenizerType::unigram);
  auto refused = run_meshtrain(run + " --steps 5 --resume --tokenizer " + other);
  CHECK(refused.status != 0);
  CHECK_THAT(refused.out, Catch::Contains("was trained with tokenizer") && Catch::Contains(other));

  // A model whose vocabulary is smaller than the tokenizer's is refused naming both numbers.
  const std::string small = write_file("vocab300.json",
                                       R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 300, "seq_len": 64})");
  auto small_tokenizer = Tokenizer::load(other);
  REQUIRE(small_tokenizer.ok());
  auto small_ids = small_tokenizer->encode(corpus_text());
  REQUIRE(small_ids.ok());
  const std::string small_data = scratch("train300.bin").string();
  REQUIRE(write_llmc_tokens(small_data, *small_ids, 300).ok());
  auto too_small = run_meshtrain("train --model " + small + " --data " + small_data +
                                 " --steps 1 --tokenizer " + bpe400());
  CHECK(too_small.status != 0);
  CHECK_THAT(too_small.out, Catch::Contains("400 pieces") && Catch::Contains("vocab 300"));
}

TEST_CASE("a checkpoint's tokenizer copy is verified on load and removed when no manifest names it") {
  const fs::path dir = scratch("ckpt-unit");
  fs::create_directories(dir);
  // A directory holding only a tokenizer copy (a run stopped before its first commit) is still ours.
  auto installed = install_checkpoint_tokenizer(dir.string(), bpe400(), 400);
  REQUIRE(installed.ok());
  CHECK(installed->file.starts_with("tokenizer-"));
  const std::string model = read_file(bpe400());
  CHECK(installed->bytes == model.size());
  CHECK(installed->crc32 == checkpoint_crc32({reinterpret_cast<const std::uint8_t*>(model.data()), model.size()}));
  CHECK(read_file(dir / installed->file) == model);
  REQUIRE(claim_checkpoint_dir(dir.string(), CheckpointUse::fresh).ok());

  auto commit = [&](bool with_tokenizer) {
    CheckpointWriter w;
    w.set_step(1);
    w.set_rng({{"seed", 1}});
    if (with_tokenizer) w.set_tokenizer(*installed);
    REQUIRE(w.add_tensor("rank0/w", {2}, {1.f, 2.f}).ok());
    const Status s = w.commit(dir.string());
    INFO((s.ok() ? std::string() : s.error().message()));
    REQUIRE(s.ok());
  };
  commit(true);
  auto loaded = load_checkpoint(dir.string());
  REQUIRE(loaded.ok());
  REQUIRE(loaded->meta.tokenizer.has_value());
  CHECK(loaded->meta.tokenizer->file == installed->file);
  CHECK(loaded->meta.tokenizer->crc32 == installed->crc32);
  CHECK(loaded->meta.tokenizer->vocab == 400);

  const fs::path copy = dir / installed->file;
  const std::string good = read_file(copy);
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x20;
  std::ofstream(copy, std::ios::binary) << bad;
  auto damaged = load_checkpoint(dir.string());
  REQUIRE_FALSE(damaged.ok());
  CHECK_THAT(damaged.error().message(), Catch::Contains("checkpoint tokenizer") && Catch::Contains(bpe400()));
  std::ofstream(copy, std::ios::binary) << good;

  commit(false);
  CHECK_FALSE(fs::exists(copy));
  auto without = load_checkpoint(dir.string());
  REQUIRE(without.ok());
  CHECK_FALSE(without->meta.tokenizer.has_value());
}
