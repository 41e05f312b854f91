// `meshtrain tokenize`: trains a SentencePiece tokenizer on a corpus
// (`tokenize train`), turns text into an llm.c token file that `train --data`
// reads (`tokenize encode`) and back (`tokenize decode`).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/input_file.h"
#include "core/names.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/data/token_dataset.h"
#include "engine/data/tokenizer.h"

namespace meshtrain {

namespace {

struct TokenizeFlags {
  // train
  std::string corpus, prefix, type = "bpe";
  int vocab_size = 0;
  std::uint32_t seed = 1;
  double coverage = 1.0;
  // encode / decode
  std::string model, input, out;
};

// An output that is one of the inputs would destroy it: refuse naming both flags.
Status check_distinct(const std::string& out, const char* out_flag, const std::string& in, const char* in_flag) {
  std::error_code ec;
  const bool same = out == in || std::filesystem::equivalent(out, in, ec);
  if (same)
    return make_error("{} '{}' is the {} file; writing it would destroy the input: pass another {} path", out_flag,
                      out, in_flag, out_flag);
  return ok_status();
}

// The text of `path`, whole: encode needs every line. Files that are not
// regular (a FIFO would block) are refused by the kind of file they are.
Result<std::string> read_text(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return make_error("text file '{}' does not exist; check the --input path", path);
  if (!std::filesystem::is_regular_file(path, ec))
    return make_error("'{}' is not a regular file; pass a text file to --input", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read text file '{}'; check its permissions", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Status run_train(const TokenizeFlags& f) {
  if (f.type != "bpe" && f.type != "unigram")
    return Error(unknown_name_message("--type", f.type, {"bpe", "unigram"}));
  TokenizerTrainOptions o{f.corpus, f.prefix, f.vocab_size,
                          f.type == "bpe" ? TokenizerType::bpe : TokenizerType::unigram, f.seed,
                          f.coverage};
  MT_TRY(train_tokenizer(o));
  MT_ASSIGN(const Tokenizer t, Tokenizer::load(f.prefix + ".model"));
  fmt::print("wrote {}.model and {}.vocab: {} model, {} pieces\n", f.prefix, f.prefix, f.type, t.vocab_size());
  return ok_status();
}

Status run_encode(const TokenizeFlags& f) {
  MT_TRY(check_distinct(f.out, "--out", f.input, "--input"));
  MT_TRY(check_distinct(f.out, "--out", f.model, "--model"));
  MT_ASSIGN(const Tokenizer t, Tokenizer::load(f.model));
  MT_ASSIGN(const std::string text, read_text(f.input));
  MT_ASSIGN(const std::vector<std::uint32_t> ids, t.encode(text));
  MT_TRY(write_llmc_tokens(f.out, ids, static_cast<std::uint32_t>(t.vocab_size())).context(f.out));
  const int width = t.vocab_size() <= 65536 ? 2 : 4;
  fmt::print("wrote {}: {} tokens (uint{}), {} bytes of text, {:.2f} bytes/token\n", f.out, ids.size(), 8 * width,
             text.size(), ids.empty() ? 0.0 : static_cast<double>(text.size()) / static_cast<double>(ids.size()));
  return ok_status();
}

Status run_decode(const TokenizeFlags& f) {
  if (!f.out.empty()) {
    MT_TRY(check_distinct(f.out, "--out", f.input, "--input"));
    MT_TRY(check_distinct(f.out, "--out", f.model, "--model"));
  }
  MT_ASSIGN(const Tokenizer t, Tokenizer::load(f.model));
  MT_ASSIGN(const std::vector<std::uint32_t> ids, read_llmc_tokens(f.input));
  MT_ASSIGN(const std::string text, t.decode(ids).context(fmt::format("token file '{}'", f.input)));
  if (f.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return ok_status();
  }
  return write_output_file(f.out, text, "text file");
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "train a SentencePiece tokenizer on a corpus, and turn text into llm.c token files (train --data) "
                  "and back");
  sub->require_subcommand(1);

  CLI::App* train = sub->add_subcommand("train", "train a SentencePiece model on a corpus: writes PREFIX.model and "
                                                 "PREFIX.vocab");
  train->add_option("--input", f->corpus, "the corpus: UTF-8 text, one sentence or line per line")->required();
  train->add_option("--model-prefix", f->prefix, "writes PREFIX.model and PREFIX.vocab")->required();
  train->add_option("--vocab-size", f->vocab_size, "pieces in the vocabulary (the model's \"vocab\")")
      ->required()
      ->check(int_in({1, 1 << 24}));
  train->add_option("--type", f->type, "bpe or unigram")->capture_default_str();
  train->add_option("--character-coverage", f->coverage,
                    "share of the corpus's characters kept; rarer ones become <unk> (0.9995 suits Chinese or "
                    "Japanese)")
      ->capture_default_str()
      ->check(real_in({0, 1, true}));
  train->add_option("--seed", f->seed, "seed of SentencePiece's sentence sampling (large corpora)")
      ->capture_default_str();

  CLI::App* encode = sub->add_subcommand("encode", "encode text into an llm.c token file (uint16 ids when the "
                                                   "vocabulary fits, else uint32)");
  CLI::App* decode = sub->add_subcommand("decode", "decode an llm.c token file back into text");
  for (CLI::App* c : {encode, decode})
    c->add_option("--model", f->model, "the tokenizer: PREFIX.model written by `tokenize train`")->required();
  encode->add_option("--input", f->input, "the text to encode")->required();
  encode->add_option("--out", f->out, "the token file to write")->required();
  decode->add_option("--input", f->input, "the token file to decode")->required();
  decode->add_option("--out", f->out, "the text file to write (default: standard output)");

  return {sub, [f, train, encode] {
            if (train->parsed()) return run_train(*f);
            if (encode->parsed()) return run_encode(*f);
            return run_decode(*f);
          }};
}

}  // namespace meshtrain
