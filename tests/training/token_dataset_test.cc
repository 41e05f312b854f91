#include "engine/data/token_dataset.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/training/training_data.h"
#include "error_of.h"
#include "temp_dir.h"
#include "token_files.h"

using namespace meshtrain;
using meshtrain::testing::error_of;
using meshtrain::testing::TempDir;
using namespace meshtrain::testing;

namespace {

constexpr std::uint32_t kVocab = 512;

std::vector<std::uint32_t> all_tokens(TokenSpan t) {
  std::vector<std::uint32_t> out(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) out[i] = t[i];
  return out;
}

Result<TokenDataset> load(const std::string& data, int seq_len) {
  return load_token_dataset(identify_data(data), seq_len);
}

ModelSpec model_with_vocab(int vocab) {
  ModelSpec m = model_preset("tiny").value();
  m.vocab = vocab;
  m.name = "tiny-" + std::to_string(vocab);
  return m;
}

Plan plan_with_seq(int seq) {
  Plan p;
  p.seq_len = seq;
  return p;
}

// Overwrites `bytes` at `offset` in the file.
void patch(const std::string& path, std::size_t offset, const std::string& bytes) {
  std::string s = read_file(path);
  s.replace(offset, bytes.size(), bytes);
  write_bytes(path, s);
}

template <class T>
std::string le(T v) {
  std::string s;
  append_le(s, v);
  return s;
}

}  // namespace

TEST_CASE("llm.c token files round trip, uint16 and uint32", "[dataset][tokens]") {
  TempDir tmp;
  for (int width : {2, 4}) {
    CAPTURE(width);
    const std::string path = tmp / ("tokens" + std::to_string(width) + ".bin");
    // uint32 files hold ids past uint16's range.
    const std::uint32_t vocab = width == 2 ? 50257 : 128256;
    const auto ids = test_ids(1000, vocab);
    write_llmc(path, ids, width);
    const DataSource s = identify_data(path);
    CHECK(s.format == DataFormat::llmc);
    CHECK(s.path == path);
    auto d = load(path, 16);
    REQUIRE(d.ok());
    CHECK(d->tokens.width() == width);
    CHECK(all_tokens(d->tokens) == ids);
    CHECK(d->max_id == *std::max_element(ids.begin(), ids.end()));
    // The byte reader's split: the last 10% (100 tokens) held out.
    CHECK(d->val_size == 100);
    CHECK(d->train().size() == 900);
    CHECK(d->val()[0] == ids[900]);
    CHECK(d->val()[99] == ids[999]);
    CHECK(d->document_starts.empty());
    // The file is the checkpoint's content: header and ids, as written.
    CHECK(d->file->bytes().size() == 1024 + 1000 * static_cast<std::size_t>(width));
    CHECK(check_token_vocab(*d, static_cast<int>(vocab), "m").ok());
  }
}

TEST_CASE("a file without an llm.c magic is bytes, a Megatron pair is found from any of its names",
          "[dataset][tokens]") {
  TempDir tmp;
  const std::string text = tmp / "text.txt";
  write_file(text, std::string(2000, 'x'));
  CHECK(identify_data(text).format == DataFormat::bytes);
  const std::string prefix = tmp / "corpus_text_document";
  write_megatron(prefix, {test_ids(100, kVocab)});
  for (const std::string& name : {prefix, prefix + ".bin", prefix + ".idx"}) {
    CAPTURE(name);
    const DataSource s = identify_data(name);
    CHECK(s.format == DataFormat::megatron);
    CHECK(s.path == prefix);
  }
  // A .bin without its .idx is just a file (here: bytes).
  const std::string lone = tmp / "lone.bin";
  write_file(lone, std::string(100, 'y'));
  CHECK(identify_data(lone).format == DataFormat::bytes);
  CHECK(identify_data(tmp / "missing").format == DataFormat::bytes);
}

TEST_CASE("Megatron indexed datasets round trip with their documents", "[dataset][tokens]") {
  TempDir tmp;
  for (std::uint8_t code : {kMegatronUint8, kMegatronUint16, kMegatronInt32}) {
    CAPTURE(static_cast<int>(code));
    const std::string prefix = tmp / ("docs" + std::to_string(code));
    const std::uint32_t vocab = code == kMegatronUint8 ? 256 : code == kMegatronUint16 ? 50257 : 100000;
    // Documents of 300, 0 (empty), 450, 150 and 100 tokens: 1000 in all.
    std::vector<std::vector<std::uint32_t>> docs;
    std::size_t first = 0;
    for (std::size_t n : {300, 0, 450, 150, 100}) {
      docs.push_back(test_ids(n, vocab, first));
      first += n;
    }
    write_megatron(prefix, docs, code);
    auto d = load(prefix, 16);
    REQUIRE(d.ok());
    CHECK(d->tokens_file == prefix + ".bin");
    CHECK(all_tokens(d->tokens) == test_ids(1000, vocab));
    CHECK(d->document_starts == std::vector<std::uint64_t>{0, 300, 300, 750, 900});
    CHECK(d->signed_ids == (code == kMegatronInt32));
    // A tenth (100 tokens) would split at token 900: the start of the last document, so it stays.
    CHECK(d->val_size == 100);
    // With --seq-len 120 the split (1000 - 121 = 879) falls inside the document at 750: it moves back there.
    auto longer = load(prefix, 120);
    REQUIRE(longer.ok());
    CHECK(longer->val_size == 250);
    CHECK(longer->val()[0] == test_id(750, vocab));
  }
  // One document only: no boundary to move to, the token split stands.
  const std::string one = tmp / "one";
  write_megatron(one, {test_ids(1000, kVocab)});
  auto d = load(one, 16);
  REQUIRE(d.ok());
  CHECK(d->val_size == 100);
}

TEST_CASE("batches are the token file's ids at the loader's offsets", "[dataset][tokens]") {
  TempDir tmp;
  const std::string path = tmp / "tokens.bin";
  const auto ids = test_ids(5000, 50257);
  write_llmc(path, ids);
  auto d = load(path, 16);
  REQUIRE(d.ok());
  DataLoader loader(d->train(), 1234);
  const DataLoader probe(d->train(), 1234);
  for (int call = 0; call < 3; ++call) {
    auto b = loader.next(4, 16);
    REQUIRE(b.ok());
    for (int r = 0; r < 4; ++r) {
      const std::uint64_t offset = probe.offset_of(static_cast<std::uint64_t>(call) * 4 + r, 16);
      CHECK(offset + 17 <= 4500);  // within the training split
      for (int t = 0; t < 16; ++t) {
        CHECK(b->ids[r * 16 + t] == static_cast<std::int32_t>(ids[offset + t]));
        CHECK(b->targets[r * 16 + t] == static_cast<std::int32_t>(ids[offset + t + 1]));
      }
    }
  }
  // Validation reads the held-out tail in order.
  auto v = validation_batches(d->val(), 2, 16, 3);
  REQUIRE(v.ok());
  REQUIRE(v->size() == 2);
  CHECK((*v)[0].ids[0] == static_cast<std::int32_t>(ids[4500]));
  CHECK((*v)[1].ids[0] == static_cast<std::int32_t>(ids[4500 + 2 * 16]));
  CHECK((*v)[1].targets[15] == static_cast<std::int32_t>(ids[4500 + 3 * 16]));
}

TEST_CASE("corrupt and truncated llm.c files are refused naming the file and the field", "[dataset][tokens]") {
  TempDir tmp;
  const std::string path = tmp / "bad.bin";
  const auto ids = test_ids(100, 1000);

  write_bytes(path, llmc_file(ids).substr(0, 500));
  CHECK(error_of(load(path, 8)) ==
        "token file '" + path + "' is 500 bytes, shorter than the 1024-byte header of an llm.c token file (its "
        "magic 20240520 says it is one); the file is truncated: write it again");

  write_bytes(path, llmc_file(ids).substr(0, 1024 + 150));
  CHECK(error_of(load(path, 8)) ==
        "token file '" + path + "': its header (header[2]) says 100 tokens of 2 bytes (200 bytes after the "
        "1024-byte header), but the file holds 150 bytes after it; the file is truncated: write it again");
  write_bytes(path, llmc_file(ids) + "xx");
  CHECK_THAT(error_of(load(path, 8)), Catch::EndsWith("but the file holds 202 bytes after it; the file is corrupt: "
                                                      "write it again"));

  write_llmc(path, ids);
  patch(path, 4, le<std::int32_t>(3));
  CHECK(error_of(load(path, 8)) ==
        "token file '" + path + "' has magic 20240520 and header version 3; meshtrain reads llm.c's version 1 "
        "(magic 20240520, uint16 tokens) and version 7 (magic 20240801, uint32 tokens): write the file with "
        "llm.c's dev/data/data_common.py");

  write_llmc(path, ids);
  patch(path, 8, le<std::int32_t>(-1));
  CHECK_THAT(error_of(load(path, 8)), Catch::Contains("has a negative token count -1 in its header (header[2])"));

  write_llmc(path, test_ids(17, 1000));
  CHECK(error_of(load(path, 8)) ==
        "token file '" + path + "' holds 17 tokens, but --seq-len 8 needs at least 18 (9 for one training "
        "sequence and 9 for the held-out validation split); use more data or a smaller --seq-len");
  write_llmc(path, test_ids(18, 1000));
  CHECK(load(path, 8).ok());
}

TEST_CASE("ids at or past the model's vocabulary are refused at open", "[dataset][tokens]") {
  TempDir tmp;
  const std::string path = tmp / "big-ids.bin";
  auto ids = test_ids(200, 500);
  ids[123] = 50256;
  write_llmc(path, ids);
  auto d = load(path, 8);
  REQUIRE(d.ok());
  CHECK(check_token_vocab(*d, 512, "small").error().message() ==
        "token file '" + path + "' holds token id 50256 (token 123; the largest is 50256), but model 'small' has "
        "vocab 512; use a model with \"vocab\" of at least 50257, or tokenize the data with the model's tokenizer");
  CHECK(check_token_vocab(*d, 50257, "gpt2").ok());
  // The largest id equal to the vocabulary is one too many.
  CHECK_FALSE(check_token_vocab(*d, 50256, "m").ok());

  // Megatron int32 ids are signed: a negative one is corrupt.
  const std::string prefix = tmp / "negative";
  std::vector<std::uint32_t> doc = test_ids(100, 500);
  doc[7] = static_cast<std::uint32_t>(-5);
  write_megatron(prefix, {doc}, kMegatronInt32);
  auto neg = load(prefix, 8);
  REQUIRE(neg.ok());
  CHECK(check_token_vocab(*neg, 512, "m").error().message() ==
        "token file '" + prefix + ".bin' holds token id -5 (token 7); ids must be in [0, vocab): the file is corrupt");

  // Through the trainer's check: the model's vocabulary decides.
  CHECK_THAT(check_training_data(path, model_with_vocab(512), plan_with_seq(8)).error().message(),
             Catch::Contains("holds token id 50256 (token 123") && Catch::Contains("model 'tiny-512' has vocab 512"));
  CHECK(check_training_data(path, model_with_vocab(50304), plan_with_seq(8)).ok());
}

TEST_CASE("corrupt and truncated Megatron datasets are refused naming the file and the field", "[dataset][tokens]") {
  TempDir tmp;
  const std::string prefix = tmp / "ds";
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  const std::vector<std::vector<std::uint32_t>> docs = {test_ids(60, 500), test_ids(40, 500, 60)};
  const std::string good_idx = megatron_index(docs), good_bin = megatron_bin(docs);
  auto reset = [&] {
    write_bytes(idx, good_idx);
    write_bytes(bin, good_bin);
  };
  reset();
  REQUIRE(load(prefix, 8).ok());

  std::filesystem::remove(bin);
  CHECK(error_of(load(prefix, 8)) ==
        "Megatron dataset '" + prefix + "' needs '" + bin + "' and '" + idx + "', but '" + bin +
            "' does not exist; pass the PREFIX of a .bin/.idx pair written by tools/preprocess_data.py");
  reset();

  write_bytes(idx, good_idx.substr(0, 20));
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "' is 20 bytes, shorter than the 34-byte header of a Megatron index (magic, version, "
        "dtype, sequence and document counts); the file is truncated: write it again with Megatron-LM's "
        "tools/preprocess_data.py");

  reset();
  patch(idx, 0, "NOTIDX");
  CHECK_THAT(error_of(load(prefix, 8)),
             Catch::StartsWith("index file '" + idx + "' does not start with Megatron's magic \"MMIDIDX\\0\\0\" "
                               "(field 'header')"));
  reset();
  patch(idx, 9, le<std::uint64_t>(2));
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "' has version 2 (field 'version'); meshtrain reads Megatron's version 1");
  reset();
  patch(idx, 17, le<std::uint8_t>(7));
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "' has dtype code 7 (float32) (field 'dtype'); token ids are read as uint8 (1), uint16 "
        "(8) or int32 (4), as preprocess_data.py writes them");

  reset();
  write_bytes(idx, good_idx.substr(0, good_idx.size() - 8));
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "' is 74 bytes, but its header's sequence count 2 and document count 3 (fields "
        "'sequence_count', 'document_count') need 82 bytes; the file is truncated: write it again");
  reset();
  patch(idx, 18, le<std::uint64_t>(1ull << 60));
  CHECK_THAT(error_of(load(prefix, 8)),
             Catch::Contains("too short for its header's sequence count 1152921504606846976"));

  reset();
  // The index: header (34 bytes), sequence_lengths at 34, sequence_pointers at 42, document_indices at 58.
  patch(idx, 42 + 8, le<std::int64_t>(100));  // sequence_pointers[1]: 120 bytes after the first 60 uint16
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "': sequence_pointers[1] is 100, but the sequences before it end at byte 120; "
        "meshtrain reads sequences stored back to back as preprocess_data.py writes them: the index is corrupt or "
        "was rewritten");
  reset();
  patch(idx, 34 + 4, le<std::int32_t>(-3));  // sequence_lengths[1]
  CHECK_THAT(error_of(load(prefix, 8)), Catch::Contains("sequence_lengths[1] is -3, negative"));
  reset();
  patch(idx, 58 + 8, le<std::int64_t>(5));  // document_indices[1] past the 2 sequences
  CHECK(error_of(load(prefix, 8)) ==
        "index file '" + idx + "': document_indices[1] is 5, outside [0, 2] (field 'document_indices': they rise "
        "from 0 to the sequence count); the index is corrupt");
  reset();
  patch(idx, 58 + 16, le<std::int64_t>(1));  // the last entry must be the sequence count
  CHECK_THAT(error_of(load(prefix, 8)),
             Catch::Contains("document_indices must run from 0 to the sequence count 2 (field 'document_indices'), "
                             "got 3 entries from 0 to 1"));

  reset();
  write_bytes(bin, good_bin.substr(0, 150));
  CHECK(error_of(load(prefix, 8)) ==
        "data file '" + bin + "' holds 150 bytes, but its index '" + idx + "' lists 100 tokens of uint16 (200 bytes; "
        "field 'sequence_lengths'); the .bin is truncated: write the pair again");
}

TEST_CASE("a token file's training data resumes bit for bit from the saved loader state", "[dataset][tokens]") {
  TempDir tmp;
  const std::string path = tmp / "resume.bin";
  write_llmc(path, test_ids(20000, kVocab));
  const ModelSpec m = model_with_vocab(kVocab);
  const Plan p = plan_with_seq(32);
  REQUIRE(check_training_data(path, m, p).ok());

  // One run of 6 steps against 3 steps, a state saved as a checkpoint writes
  // it (json), then a fresh reader restored from it for 3 more.
  auto whole = open_training_data(path, m, p, 77, 0, 1);
  REQUIRE(whole.ok());
  std::vector<std::vector<HostBatch>> expected;
  for (int step = 0; step < 6; ++step) expected.push_back((*whole)->next(2, 2).value());

  auto first = open_training_data(path, m, p, 77, 0, 1);
  REQUIRE(first.ok());
  for (int step = 0; step < 3; ++step) CHECK((*first)->next(2, 2).value()[1].ids == expected[step][1].ids);
  const auto saved = loader_state_from_json(loader_state_to_json((*first)->state()));
  REQUIRE(saved.ok());

  auto resumed = open_training_data(path, m, p, /*seed=*/1, 0, 1);  // the seed comes from the state
  REQUIRE(resumed.ok());
  (*resumed)->restore(*saved);
  for (int step = 3; step < 6; ++step) {
    const auto got = (*resumed)->next(2, 2).value();
    REQUIRE(got.size() == expected[step].size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      CHECK(got[k].ids == expected[step][k].ids);
      CHECK(got[k].targets == expected[step][k].targets);
    }
  }
  CHECK((*resumed)->state() == (*whole)->state());
  // The checkpoint's crc32 covers the file as mapped: header and ids.
  CHECK((*resumed)->content().size() == 1024 + 20000 * 2);
  CHECK((*resumed)->source() == path);
  // The two data-parallel halves of a step are the dp = 1 step.
  auto r0 = open_training_data(path, m, p, 77, 0, 2), r1 = open_training_data(path, m, p, 77, 1, 2);
  REQUIRE((r0.ok() && r1.ok()));
  const auto h0 = (*r0)->next(2, 1).value(), h1 = (*r1)->next(2, 1).value();
  std::vector<std::int32_t> joined = h0[0].ids;
  joined.insert(joined.end(), h1[0].ids.begin(), h1[0].ids.end());
  std::vector<std::int32_t> one_step = expected[0][0].ids;
  one_step.insert(one_step.end(), expected[0][1].ids.begin(), expected[0][1].ids.end());
  CHECK(joined == one_step);
}

TEST_CASE("raw bytes need a vocabulary-256 model", "[dataset][tokens]") {
  TempDir tmp;
  const std::string text = tmp / "text.txt";
  write_file(text, std::string(2000, 'x'));
  CHECK(check_training_data(text, model_with_vocab(256), plan_with_seq(16)).ok());
  CHECK(check_training_data(text, model_with_vocab(512), plan_with_seq(16)).error().message() ==
        "model 'tiny-512' has vocab 512, but '" + text + "' is read as bytes (vocab 256): it is neither an llm.c "
        "token file nor a Megatron .bin/.idx pair; pass a token file written with the model's tokenizer, or train a "
        "model with \"vocab\": 256 such as 'tiny' on the bytes");
}
