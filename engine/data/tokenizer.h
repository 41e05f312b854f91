// Tokenizer: SentencePiece models (libsentencepiece), trained on a corpus and
// used to turn text into token ids and back (`meshtrain tokenize`).
//
// Every model this module trains keeps text as it is, apart from
// SentencePiece's NFKC normalisation ("nmt_nfkc"): runs of spaces are kept
// (remove_extra_whitespaces off) and a line break is a piece of its own (a
// user-defined symbol "\n"), so decode(encode(text)) == text for any text
// that NFKC leaves unchanged and whose characters the model has seen
// (others become <unk>, decoded as " ⁇ "). Ids: 0 <unk>, 1 <s>, 2 </s>,
// then "\n", then the learnt pieces; encode never emits <s> or </s>.
//
// The header keeps SentencePiece's own headers out of its includers: only
// tokenizer.cc needs them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtrain {

enum class TokenizerType { bpe, unigram };

struct TokenizerTrainOptions {
  std::string input;         // the corpus: UTF-8 text, one sentence (or line) per line
  std::string model_prefix;  // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 0;
  TokenizerType type = TokenizerType::bpe;
  std::uint32_t seed = 1;  // SentencePiece's random generator (sentence sampling)
  // Share of the corpus's characters the model covers; the rarest beyond it
  // become <unk>. 1.0 keeps every character (alphabets; SentencePiece
  // suggests 0.9995 for Chinese or Japanese, whose rare characters would
  // otherwise fill the vocabulary).
  double character_coverage = 1.0;
};

// Trains a model with SentencePieceTrainer. Errors name the file or the
// setting and the fix; SentencePiece's own message (a vocabulary larger
// than the corpus allows names the largest it can make) is kept in them.
Status train_tokenizer(const TokenizerTrainOptions& o);

class Tokenizer {
 public:
  // Loads PREFIX.model; a file that is not a SentencePiece model is refused
  // naming it.
  static Result<Tokenizer> load(const std::string& model_path);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  int vocab_size() const;
  // The end-of-sequence id (</s>, 2 in the models `tokenize train` writes); -1 when the model has none.
  int eos_id() const;
  const std::string& path() const { return path_; }

  Result<std::vector<std::uint32_t>> encode(std::string_view text) const;
  // Ids at or past vocab_size() are refused naming the first and its position.
  Result<std::string> decode(std::span<const std::uint32_t> ids) const;

 private:
  Tokenizer() = default;
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace meshtrain
