#include "engine/training/training_data.h"

#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/ranges.h>

#include "engine/data/byte_dataset.h"
#include "engine/data/image_dataset.h"
#include "engine/data/image_loader.h"
#include "engine/data/token_dataset.h"
#include "engine/data/vqa_loader.h"
#include "models/model_io.h"

namespace meshtrain {

namespace {

// Tokens, from a file's bytes or a token file: what the text model reads.
struct TextSource {
  std::string path;
  std::span<const std::uint8_t> content;  // the bytes a checkpoint's crc32 covers
  TokenSpan train, val;
  std::shared_ptr<const void> owner;  // keeps the spans' memory (a ByteDataset, or a TokenDataset's mapping)
};

// Next-token prediction over sequences of the plan's length.
class TextData : public TrainingData {
 public:
  TextData(TextSource data, int seq, std::uint64_t seed, int dp_rank, int dp)
      : data_(std::move(data)), seq_(seq), loader_(data_.train, seed, dp_rank, dp) {}

  Result<std::vector<HostBatch>> next(int micro_batch, int count) override {
    MT_ASSIGN(Batch batch, loader_.next(micro_batch * count, seq_));
    return split(batch, micro_batch);
  }
  LoaderState state() const override { return loader_.state(); }
  void restore(const LoaderState& s) override { loader_.restore(s); }
  Result<std::vector<HostBatch>> held_out(int micro_batch, int max_samples) const override {
    MT_ASSIGN(auto batches, validation_batches(data_.val, micro_batch, seq_, max_samples));
    std::vector<HostBatch> out;
    for (const Batch& b : batches) {
      auto parts = split(b, b.rows);
      out.insert(out.end(), parts.begin(), parts.end());
    }
    return out;
  }
  const char* unit() const override { return "tok"; }
  const std::string& source() const override { return data_.path; }
  std::span<const std::uint8_t> content() const override { return data_.content; }

 private:
  static std::vector<HostBatch> split(const Batch& b, int micro_batch) {
    std::vector<HostBatch> out;
    const std::size_t per = static_cast<std::size_t>(micro_batch) * b.seq;
    for (std::size_t off = 0; off < b.ids.size(); off += per) {
      HostBatch h;
      h.ids.assign(b.ids.begin() + off, b.ids.begin() + off + per);
      h.targets.assign(b.targets.begin() + off, b.targets.begin() + off + per);
      h.batch = micro_batch;
      h.seq = b.seq;
      out.push_back(std::move(h));
    }
    return out;
  }

  TextSource data_;
  int seq_;
  DataLoader loader_;
};

// Opens the text a language model trains on and checks its ids against the
// model's vocabulary: bytes need vocab 256 (a larger model on raw bytes is
// almost surely an untokenized file passed by mistake), token files ids below
// the vocabulary.
Result<TextSource> open_text(const std::string& data, const ModelSpec& m, int seq) {
  const DataSource source = identify_data(data);
  if (source.format == DataFormat::bytes) {
    if (m.vocab != kByteVocab)
      return make_error("model '{}' has vocab {}, but '{}' is read as bytes (vocab 256): it is neither an llm.c "
                        "token file nor a Megatron .bin/.idx pair; pass a token file written with the model's "
                        "tokenizer, or train a model with \"vocab\": 256 such as 'tiny' on the bytes",
                        m.name, m.vocab, data);
    MT_ASSIGN(ByteDataset bytes, load_byte_dataset(data, seq));
    auto owned = std::make_shared<const ByteDataset>(std::move(bytes));
    return TextSource{owned->path, owned->bytes, owned->train(), owned->val(), owned};
  }
  MT_ASSIGN(TokenDataset tokens, load_token_dataset(source, seq));
  MT_TRY(check_token_vocab(tokens, m.vocab, m.name));
  return TextSource{tokens.path, tokens.file->bytes(), tokens.train(), tokens.val(), tokens.file};
}

HostBatch host_batch(ImageBatch&& b, int tokens) {
  HostBatch h;
  h.pixels = std::move(b.pixels);
  h.targets = std::move(b.labels);
  h.batch = b.rows;
  h.seq = tokens;
  return h;
}

HostBatch host_batch(VqaBatch&& b, int tokens) {
  HostBatch h;
  h.pixels = std::move(b.pixels);
  h.ids = std::move(b.ids);
  h.targets = std::move(b.answers);
  h.batch = b.rows;
  h.seq = tokens;
  return h;
}

// Rows [first, first + count) of `all`, a flat array of rows of `width` values.
template <class T>
std::vector<T> rows_of(const std::vector<T>& all, std::size_t first, std::size_t count, std::size_t width) {
  const auto at = [&](std::size_t row) { return all.begin() + static_cast<std::ptrdiff_t>(row * width); };
  return std::vector<T>(at(first), at(first + count));
}

// Replica r evaluates batches r, r + dp, ...; the engine sums over replicas.
template <class Batch>
std::vector<HostBatch> replica_share(std::vector<Batch>& batches, int dp_rank, int dp, int tokens) {
  std::vector<HostBatch> out;
  for (std::size_t k = static_cast<std::size_t>(dp_rank); k < batches.size(); k += static_cast<std::size_t>(dp))
    out.push_back(host_batch(std::move(batches[k]), tokens));
  return out;
}

// Labelled images: classification, evaluated on the test split.
class ImageData : public TrainingData {
 public:
  ImageData(std::shared_ptr<const ImageDataset> data, int tokens, std::uint64_t seed, int dp_rank, int dp)
      : data_(std::move(data)), tokens_(tokens), dp_rank_(dp_rank), dp_(dp),
        loader_(data_->train, data_->stats, seed, dp_rank, dp) {}

  Result<std::vector<HostBatch>> next(int micro_batch, int count) override {
    std::vector<HostBatch> out;
    // One draw of micro_batch·count images keeps the dp split of the whole step's batch.
    MT_ASSIGN(ImageBatch all, loader_.next(micro_batch * count));
    const std::size_t image = all.pixels.size() / static_cast<std::size_t>(all.rows);
    for (int j = 0; j < count; ++j) {
      ImageBatch part;
      part.rows = micro_batch;
      const std::size_t first = static_cast<std::size_t>(j) * micro_batch, rows = static_cast<std::size_t>(micro_batch);
      part.pixels = rows_of(all.pixels, first, rows, image);
      part.labels = rows_of(all.labels, first, rows, 1);
      out.push_back(host_batch(std::move(part), tokens_));
    }
    return out;
  }
  LoaderState state() const override { return loader_.state(); }
  void restore(const LoaderState& s) override { loader_.restore(s); }
  Result<std::vector<HostBatch>> held_out(int micro_batch, int max_samples) const override {
    const std::int64_t limit = max_samples > 0 ? max_samples : data_->test.count;
    MT_ASSIGN(auto batches, evaluation_batches(data_->test, data_->stats, micro_batch, limit));
    return replica_share(batches, dp_rank_, dp_, tokens_);
  }
  const char* unit() const override { return "img"; }
  const std::string& source() const override { return data_->dir; }
  // The training images: other images make the loader's saved position meaningless.
  std::span<const std::uint8_t> content() const override { return data_->train.pixels; }

 private:
  std::shared_ptr<const ImageDataset> data_;
  int tokens_, dp_rank_, dp_;
  ImageLoader loader_;
};

// Questions about grids of four images (engine/data/vqa_loader.h): train grids
// from the training images, evaluation questions about the test images.
class VqaData : public TrainingData {
 public:
  VqaData(std::shared_ptr<const ImageDataset> data, const ModelSpec& m, std::uint64_t seed, int dp_rank, int dp)
      : data_(std::move(data)), tokens_(m.seq_len), question_len_(m.question_len), dp_rank_(dp_rank), dp_(dp),
        loader_(data_->train, data_->stats, seed, m.question_len, dp_rank, dp) {}

  Result<std::vector<HostBatch>> next(int micro_batch, int count) override {
    // One draw of micro_batch·count samples keeps the dp split of the whole step's batch.
    MT_ASSIGN(VqaBatch all, loader_.next(micro_batch * count));
    const std::size_t grid = all.pixels.size() / static_cast<std::size_t>(all.rows);
    const std::size_t q = static_cast<std::size_t>(question_len_), per = static_cast<std::size_t>(micro_batch);
    std::vector<HostBatch> out;
    for (std::size_t first = 0; first < static_cast<std::size_t>(all.rows); first += per) {
      VqaBatch part;
      part.rows = micro_batch;
      part.pixels = rows_of(all.pixels, first, per, grid);
      part.ids = rows_of(all.ids, first, per, q);
      part.answers = rows_of(all.answers, first, per, 1);
      out.push_back(host_batch(std::move(part), tokens_));
    }
    return out;
  }
  LoaderState state() const override { return loader_.state(); }
  void restore(const LoaderState& s) override { loader_.restore(s); }
  Result<std::vector<HostBatch>> held_out(int micro_batch, int max_samples) const override {
    const std::int64_t limit = max_samples > 0 ? max_samples : data_->test.count / 4;
    MT_ASSIGN(auto batches, vqa_evaluation_batches(data_->test, data_->stats, micro_batch, question_len_, limit));
    return replica_share(batches, dp_rank_, dp_, tokens_);
  }
  const char* unit() const override { return "q"; }
  const std::string& source() const override { return data_->dir; }
  // The training images the questions are about (the questions follow from them and the seed).
  std::span<const std::uint8_t> content() const override { return data_->train.pixels; }

 private:
  std::shared_ptr<const ImageDataset> data_;
  int tokens_, question_len_, dp_rank_, dp_;
  VqaLoader loader_;
};

// Image sets by name, read once per process: the rank threads share them.
Result<std::shared_ptr<const ImageDataset>> shared_images(const std::string& name) {
  static std::mutex mu;  // guards cache
  static std::map<std::string, std::shared_ptr<const ImageDataset>> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  MT_ASSIGN(ImageDataset data, load_image_dataset(name));
  auto shared = std::make_shared<const ImageDataset>(std::move(data));
  cache.emplace(name, shared);
  return shared;
}

Status check_images(const ImageDataset& d, const ModelSpec& m) {
  for (const ImageSet* set : {&d.train, &d.test})
    MT_TRY(check_image_shape(*set, m.image_size, m.image_size, m.channels)
               .context(fmt::format("model '{}'", m.name)));
  if (d.train.classes > m.classes)
    return make_error("the images in '{}' carry {} classes, model '{}' predicts {}; use a model with "
                      "\"classes\": {}",
                      d.dir, d.train.classes, m.name, m.classes, d.train.classes);
  return ok_status();
}

// A VQA model reads 2×2 grids of the set's images and questions in the VQA vocabulary.
Status check_vqa_data(const ImageDataset& d, const ModelSpec& m) {
  for (const ImageSet* set : {&d.train, &d.test}) MT_TRY(check_vqa_images(*set));
  const int words = static_cast<int>(vqa_vocabulary().size());
  if (m.image_size != kVqaGridSide || m.channels != 1)
    return make_error("model '{}' reads {}×{}×{} images, the VQA grids of '{}' are {}×{}×1; use a model with "
                      "\"image_size\": {}, \"channels\": 1 such as 'vqa-fmnist'",
                      m.name, m.image_size, m.image_size, m.channels, d.dir, kVqaGridSide, kVqaGridSide, kVqaGridSide);
  if (m.vocab < words)
    return make_error("model '{}' has vocab {}, the VQA questions and answers use {} words; use \"vocab\" >= {}",
                      m.name, m.vocab, words, words);
  if (m.question_len < kVqaQuestionTokens)
    return make_error("model '{}' reads questions of {} tokens, the longest VQA question has {}; use "
                      "\"question_len\" >= {}", m.name, m.question_len, kVqaQuestionTokens, kVqaQuestionTokens);
  return ok_status();
}

// What the model reads decides the data source (models/model_io.h): images,
// images with questions, or token ids.
bool reads_images(const ModelSpec& m) { return model_io(m).image_side > 0; }
bool reads_questions(const ModelSpec& m) {
  const ModelIo io = model_io(m);
  return io.image_side > 0 && io.ids_per_sample > 0;
}

// The presets that read `data`'s images: classifiers of 28×28 grey images
// (Fashion-MNIST's) and VQA models of grids of them.
std::string image_model_names() {
  std::vector<std::string> names;
  for (const std::string& name : model_preset_names()) {
    const ModelSpec m = model_preset(name).value();
    const bool classifier = reads_images(m) && !reads_questions(m) && m.image_size == 28 && m.channels == 1;
    const bool vqa = reads_questions(m) && m.image_size == kVqaGridSide && m.channels == 1;
    if (classifier || vqa) names.push_back(fmt::format("'{}'", name));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

// Image data for a language model, or a file of tokens for an image model:
// named as the mismatch it is, before either loader reads (and misreads) it.
Status check_data_kind(const std::string& data, const ModelSpec& m) {
  if (!reads_images(m) && names_image_dataset(data))
    return make_error("'{}' is an image dataset, but model '{}' is a language model (it trains on a token file, or "
                      "on a file's bytes as tokens); train a vision model on the images ({}), or pass such a file "
                      "with --data",
                      data, m.name, image_model_names());
  std::error_code ec;
  if (reads_images(m) && std::filesystem::is_regular_file(data, ec))
    return make_error("model '{}' is a vision model and trains on images, but --data '{}' is a file (the tokens a "
                      "language model reads); pass --data fashion-mnist or a directory of IDX image files, or train "
                      "a language model such as 'tiny' on the file",
                      m.name, data);
  return ok_status();
}

}  // namespace

Status check_training_data(const std::string& data, const ModelSpec& m, const Plan& p) {
  if (data.empty() && reads_images(m))
    return make_error("no training images: pass --data fashion-mnist or a directory of IDX files");
  if (data.empty())
    return make_error("no training data: pass --data FILE (an llm.c token file, a Megatron PREFIX of a .bin/.idx "
                      "pair, or any file, whose bytes are the tokens)");
  MT_TRY(check_data_kind(data, m));
  if (reads_questions(m)) {
    MT_ASSIGN(auto images, shared_images(data));
    return check_vqa_data(*images, m);
  }
  if (reads_images(m)) {
    MT_ASSIGN(auto images, shared_images(data));
    return check_images(*images, m);
  }
  MT_TRY(open_text(data, m, p.effective_seq_len(m)));
  return ok_status();
}

Result<std::unique_ptr<TrainingData>> open_training_data(const std::string& data, const ModelSpec& m, const Plan& p,
                                                         std::uint64_t seed, int dp_rank, int dp) {
  MT_TRY(check_data_kind(data, m));
  if (reads_questions(m)) {
    MT_ASSIGN(auto images, shared_images(data));
    MT_TRY(check_vqa_data(*images, m));
    return std::unique_ptr<TrainingData>(std::make_unique<VqaData>(images, m, seed, dp_rank, dp));
  }
  if (reads_images(m)) {
    MT_ASSIGN(auto images, shared_images(data));
    MT_TRY(check_images(*images, m));
    return std::unique_ptr<TrainingData>(std::make_unique<ImageData>(images, m.seq_len, seed, dp_rank, dp));
  }
  MT_ASSIGN(TextSource text, open_text(data, m, p.effective_seq_len(m)));
  return std::unique_ptr<TrainingData>(
      std::make_unique<TextData>(std::move(text), p.effective_seq_len(m), seed, dp_rank, dp));
}

}  // namespace meshtrain
