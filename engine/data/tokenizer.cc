#include "engine/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "core/input_file.h"

namespace meshtrain {

namespace {

// The piece every line break becomes (a user-defined symbol: never split or normalised).
constexpr const char* kNewline = "\n";

Status check_corpus(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error("corpus '{}' does not exist; check the --input path", path);
  if (!std::filesystem::is_regular_file(path, ec))
    return make_error("corpus '{}' is not a regular file; pass a text file to --input", path);
  if (std::filesystem::file_size(path, ec) == 0)
    return make_error("corpus '{}' is empty; pass a text file with the sentences to learn from", path);
  return ok_status();
}

}  // namespace

Status train_tokenizer(const TokenizerTrainOptions& o) {
  MT_TRY(check_corpus(o.input));
  if (o.vocab_size < 1) return make_error("--vocab-size must be positive, got {}", o.vocab_size);
  if (!(o.character_coverage > 0 && o.character_coverage <= 1))
    return make_error("--character-coverage must be in (0, 1], got {}", o.character_coverage);
  const std::string model = o.model_prefix + ".model", vocab = o.model_prefix + ".vocab";
  std::error_code ec;
  for (const std::string& out : {model, vocab})
    if (std::filesystem::equivalent(out, o.input, ec))
      return make_error("--model-prefix '{}' would write '{}', which is the --input corpus; choose another prefix",
                        o.model_prefix, out);
  MT_TRY(probe_output_file(model, "tokenizer model"));
  MT_TRY(probe_output_file(vocab, "tokenizer vocabulary"));
  // Deterministic: one trainer thread (the unigram trainer's EM sums
  // per-thread counts, so other thread counts may round differently), and the
  // one random draw SentencePiece makes (sampling input_sentence_size lines
  // of a larger corpus) seeded from --seed. The same corpus, options, seed and
  // libsentencepiece version write the same model, byte for byte.
  sentencepiece::SetRandomGeneratorSeed(o.seed);
  const std::unordered_map<std::string, std::string> args = {
      {"input", o.input},
      {"model_prefix", o.model_prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.type == TokenizerType::bpe ? "bpe" : "unigram"},
      {"num_threads", "1"},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"user_defined_symbols", kNewline},
      {"remove_extra_whitespaces", "false"},
      // Errors only: the command prints its own summary, and SentencePiece warns
      // on every run that the "\n" piece cannot be written plainly in PREFIX.vocab.
      {"minloglevel", "2"},
  };
  const sentencepiece::util::Status s = sentencepiece::SentencePieceTrainer::Train(args);
  if (s.ok()) return ok_status();
  const std::string why = s.ToString();
  if (why.find("Vocabulary size too high") != std::string::npos ||
      why.find("Vocabulary size is smaller than required_chars") != std::string::npos)
    return make_error("SentencePiece cannot make a vocabulary of {} from corpus '{}': {}; pass the --vocab-size it "
                      "names, or a larger corpus",
                      o.vocab_size, o.input, why);
  return make_error("SentencePiece could not train on corpus '{}': {}", o.input, why);
}

Result<Tokenizer> Tokenizer::load(const std::string& model_path) {
  MT_ASSIGN(const std::string bytes, read_input_file(model_path, "tokenizer model"));
  Tokenizer t;
  t.path_ = model_path;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // An empty file parses as an empty model: no pieces is no model either.
  const sentencepiece::util::Status s = t.sp_->LoadFromSerializedProto(bytes);
  if (!s.ok() || t.sp_->GetPieceSize() < 1)
    return make_error("'{}' is not a SentencePiece model{}; pass the PREFIX.model that `meshtrain tokenize train` "
                      "(or spm_train) wrote",
                      model_path, s.ok() ? " (it holds no pieces)" : " (it does not parse as one)");
  return t;
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }

Result<std::vector<std::uint32_t>> Tokenizer::encode(std::string_view text) const {
  // Line by line, as the trainer saw the corpus: each line starts a word (the
  // dummy-prefix "▁"), and the breaks are the newline piece.
  const int newline = sp_->PieceToId(kNewline);
  const bool has_newline = sp_->IdToPiece(newline) == kNewline;
  std::vector<std::uint32_t> out;
  std::vector<int> ids;
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t end = text.find('\n', at);
    const bool last = end == std::string_view::npos;
    if (last) end = text.size();
    if (end > at) {
      const sentencepiece::util::Status s = sp_->Encode(text.substr(at, end - at), &ids);
      if (!s.ok()) return make_error("tokenizer '{}' cannot encode byte {}..{}: {}", path_, at, end, s.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (last) break;
    if (!has_newline)
      return make_error("tokenizer '{}' has no line-break piece, so the text's line breaks would be lost; train the "
                        "tokenizer with `meshtrain tokenize train`",
                        path_);
    out.push_back(static_cast<std::uint32_t>(newline));
    at = end + 1;
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const std::uint32_t> ids) const {
  const auto vocab = static_cast<std::uint32_t>(vocab_size());
  // PieceToId answers <unk>'s id for a model without the newline piece: -1 then matches no id.
  const int newline = sp_->IdToPiece(sp_->PieceToId(kNewline)) == kNewline ? sp_->PieceToId(kNewline) : -1;
  std::string out, line;
  std::vector<int> part;
  // Each line decodes alone, as encode made it (its leading "▁" is the dummy prefix).
  auto flush = [&]() -> Status {
    if (part.empty()) return ok_status();
    const sentencepiece::util::Status s = sp_->Decode(part, &line);
    if (!s.ok()) return make_error("tokenizer '{}' cannot decode: {}", path_, s.ToString());
    out += line;
    part.clear();
    return ok_status();
  };
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab)
      return make_error("token {} is id {}, but tokenizer '{}' has {} pieces; the tokens were made by another "
                        "tokenizer: decode them with that one",
                        i, ids[i], path_, vocab);
    if (static_cast<int>(ids[i]) == newline) {
      MT_TRY(flush());
      out += '\n';
    } else {
      part.push_back(static_cast<int>(ids[i]));
    }
  }
  MT_TRY(flush());
  return out;
}

}  // namespace meshtrain
