#include "engine/generate/text_model.h"

#include <filesystem>

#include "core/host_memory.h"
#include "engine/checkpoint/checkpoint.h"

namespace meshtrain {

namespace {

constexpr int kByteVocab = 256;

}  // namespace

Result<std::vector<std::int32_t>> TextCodec::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  if (!tokenizer_) {
    for (const char c : text) ids.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
    return ids;
  }
  MT_ASSIGN(const std::vector<std::uint32_t> pieces, tokenizer_->encode(text));
  ids.assign(pieces.begin(), pieces.end());
  return ids;
}

Result<std::string> TextCodec::decode(std::span<const std::int32_t> ids) const {
  if (!tokenizer_) {
    std::string text;
    for (const std::int32_t id : ids) text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    return text;
  }
  const std::vector<std::uint32_t> pieces(ids.begin(), ids.end());
  return tokenizer_->decode(pieces);
}

Result<std::string> TextCodec::continuation(std::span<const std::int32_t> prompt,
                                            std::span<const std::int32_t> tokens) const {
  std::vector<std::int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), tokens.begin(), tokens.end());
  MT_ASSIGN(const std::string whole, decode(all));
  MT_ASSIGN(const std::string before, decode(prompt));
  if (whole.starts_with(before)) return whole.substr(before.size());
  return decode(tokens);  // a normalisation that rewrote the prompt's end: the new tokens alone
}

std::optional<std::int32_t> TextCodec::eos() const {
  if (!tokenizer_ || tokenizer_->eos_id() < 0) return std::nullopt;
  return tokenizer_->eos_id();
}

int TextCodec::vocab() const { return tokenizer_ ? tokenizer_->vocab_size() : kByteVocab; }

std::string TextCodec::describe() const { return tokenizer_ ? tokenizer_->path() : "bytes"; }

Result<TrainedModel> load_trained_model(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error("checkpoint directory '{}' does not exist; pass the --checkpoint DIR of a `meshtrain train "
                      "--checkpoint DIR` run",
                      dir);
  if (!has_checkpoint(dir))
    return make_error("'{}' holds no checkpoint (no manifest.json); pass the --checkpoint DIR of a `meshtrain train "
                      "--checkpoint DIR` run",
                      dir);
  // The manifest first: the model is checked before its payload is read.
  MT_ASSIGN(const CheckpointManifest manifest, read_checkpoint_manifest(dir));
  TrainedModel t;
  t.dir = dir;
  MT_ASSIGN(t.model, model_from_json(manifest.meta.model).context(fmt::format("checkpoint '{}': model", dir)));
  MT_TRY(CachedDecoder::check_model(t.model).context(fmt::format("checkpoint '{}'", dir)));
  MT_TRY(check_host_memory(static_cast<double>(manifest.payload_bytes), fmt::format("reading checkpoint '{}'", dir),
                           "use a machine with more memory"));
  MT_ASSIGN(Checkpoint ckpt, load_checkpoint(dir));
  t.step = ckpt.meta.step;
  if (ckpt.meta.tokenizer) {
    const std::string path = (std::filesystem::path(dir) / ckpt.meta.tokenizer->file).string();
    MT_ASSIGN(Tokenizer tok, Tokenizer::load(path));
    t.codec = TextCodec::sentencepiece(std::move(tok));
  } else if (t.model.vocab != kByteVocab) {
    return make_error("checkpoint '{}' holds a model of vocab {} trained without --tokenizer, so it does not say "
                      "how text becomes its tokens; train it with `train --tokenizer PREFIX.model` (or a byte-level "
                      "model, vocab 256, on raw text)",
                      dir, t.model.vocab);
  }
  constexpr std::string_view kPrefix = "params/";
  for (auto& [name, tensor] : ckpt.tensors)
    if (name.starts_with(kPrefix)) t.parameters.emplace(name.substr(kPrefix.size()), std::move(tensor.data));
  return t;
}

Status load_parameters(CachedDecoder& d, const TrainedModel& t) {
  Backend& b = d.backend();
  for (const ParamSlot& slot : d.parameters().slots()) {
    auto it = t.parameters.find(slot.info.name);
    if (it == t.parameters.end())
      return make_error("checkpoint '{}' has no parameter '{}'; it was written by another model", t.dir, slot.info.name);
    // One rank holds every parameter whole (tp 1: no vocabulary padding), in the full tensor's order.
    if (static_cast<std::int64_t>(it->second.size()) != slot.numel)
      return make_error("checkpoint '{}' parameter '{}' has {} elements, the model needs {}", t.dir, slot.info.name,
                        it->second.size(), slot.numel);
    Tensor value = slot.value;
    b.write(value, it->second);
  }
  return b.synchronize();
}

}  // namespace meshtrain
