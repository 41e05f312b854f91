#include "engine/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/data/byte_dataset.h"

namespace meshtrain {

namespace {

template <class T>
T read_le(std::span<const std::uint8_t> bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

bool is_llmc_magic(std::int32_t magic) { return magic == kLlmcMagicGpt2 || magic == kLlmcMagicLlama3; }

// The first four bytes of `path` as llm.c's magic (0 when shorter or unreadable).
std::int32_t leading_int32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint8_t b[4] = {};
  if (!in.read(reinterpret_cast<char*>(b), 4)) return 0;
  return read_le<std::int32_t>(b, 0);
}

// The tokens need one sequence (seq + 1 tokens) in each split.
Status check_length(const std::string& file, std::size_t tokens, int seq_len) {
  const std::size_t need = 2 * (static_cast<std::size_t>(seq_len) + 1);
  if (tokens >= need) return ok_status();
  return make_error("token file '{}' holds {} tokens, but --seq-len {} needs at least {} ({} for one training "
                    "sequence and {} for the held-out validation split); use more data or a smaller --seq-len",
                    file, tokens, seq_len, need, seq_len + 1, seq_len + 1);
}

std::uint32_t max_token(TokenSpan t) {
  // One switch per file, not per token: the loop vectorises for each width.
  const std::span<const std::uint8_t> b = t.bytes();
  std::uint32_t m = 0;
  switch (t.width()) {
    case 1:
      for (std::size_t i = 0; i < t.size(); ++i) m = std::max<std::uint32_t>(m, b[i]);
      break;
    case 2:
      for (std::size_t i = 0; i < t.size(); ++i) m = std::max<std::uint32_t>(m, read_le<std::uint16_t>(b, 2 * i));
      break;
    default:
      for (std::size_t i = 0; i < t.size(); ++i) m = std::max(m, read_le<std::uint32_t>(b, 4 * i));
  }
  return m;
}

Status load_llmc(TokenDataset& d) {
  const std::span<const std::uint8_t> bytes = d.file->bytes();
  const std::string& f = d.path;
  if (bytes.size() < kLlmcHeaderBytes)
    return make_error("token file '{}' is {} bytes, shorter than the {}-byte header of an llm.c token file (its "
                      "magic {} says it is one); the file is truncated: write it again",
                      f, bytes.size(), kLlmcHeaderBytes, read_le<std::int32_t>(bytes, 0));
  const auto magic = read_le<std::int32_t>(bytes, 0);
  const auto version = read_le<std::int32_t>(bytes, 4);
  const auto count = read_le<std::int32_t>(bytes, 8);
  const int want = magic == kLlmcMagicGpt2 ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
  if (version != want)
    return make_error("token file '{}' has magic {} and header version {}; meshtrain reads llm.c's version {} "
                      "(magic {}, uint16 tokens) and version {} (magic {}, uint32 tokens): write the file with "
                      "llm.c's dev/data/data_common.py",
                      f, magic, version, kLlmcVersionGpt2, kLlmcMagicGpt2, kLlmcVersionLlama3, kLlmcMagicLlama3);
  const int width = magic == kLlmcMagicGpt2 ? 2 : 4;
  if (count < 0)
    return make_error("token file '{}' has a negative token count {} in its header (header[2]); the header is "
                      "corrupt: write the file again",
                      f, count);
  const std::size_t body = bytes.size() - kLlmcHeaderBytes;
  const std::size_t expect = static_cast<std::size_t>(count) * width;
  if (body != expect)
    return make_error("token file '{}': its header (header[2]) says {} tokens of {} bytes ({} bytes after the "
                      "{}-byte header), but the file holds {} bytes after it; the file is {}: write it again",
                      f, count, width, expect, kLlmcHeaderBytes, body, body < expect ? "truncated" : "corrupt");
  d.tokens = TokenSpan(bytes.data() + kLlmcHeaderBytes, static_cast<std::size_t>(count), width);
  return ok_status();
}

struct MegatronDtype {
  std::uint8_t code;
  const char* name;
  int width;
};

constexpr MegatronDtype kMegatronDtypes[] = {
    {1, "uint8", 1}, {2, "int8", 1},    {3, "int16", 2},   {4, "int32", 4},
    {5, "int64", 8}, {6, "float64", 8}, {7, "float32", 4}, {8, "uint16", 2},
};

// A Megatron index's header, checked against the file's size, and where its arrays start.
struct MegatronIndex {
  const MegatronDtype* dtype = nullptr;
  std::uint64_t sequences = 0, documents = 0;
  std::size_t lengths_at = 0, pointers_at = 0, documents_at = 0;
};

Result<MegatronIndex> read_megatron_header(const std::string& idx, std::span<const std::uint8_t> b) {
  if (b.size() < kMegatronIndexHeaderBytes)
    return make_error("index file '{}' is {} bytes, shorter than the {}-byte header of a Megatron index (magic, "
                      "version, dtype, sequence and document counts); the file is truncated: write it again with "
                      "Megatron-LM's tools/preprocess_data.py",
                      idx, b.size(), kMegatronIndexHeaderBytes);
  if (std::memcmp(b.data(), kMegatronIndexMagic, sizeof kMegatronIndexMagic) != 0)
    return make_error("index file '{}' does not start with Megatron's magic \"MMIDIDX\\0\\0\" (field 'header'); it "
                      "is not a Megatron indexed dataset: pass the PREFIX of a .bin/.idx pair written by "
                      "tools/preprocess_data.py",
                      idx);
  const auto version = read_le<std::uint64_t>(b, 9);
  if (version != 1)
    return make_error("index file '{}' has version {} (field 'version'); meshtrain reads Megatron's version 1", idx,
                      version);
  MegatronIndex h;
  const auto code = read_le<std::uint8_t>(b, 17);
  for (const MegatronDtype& t : kMegatronDtypes)
    if (t.code == code) h.dtype = &t;
  if (h.dtype == nullptr || (code != kMegatronUint8 && code != kMegatronUint16 && code != kMegatronInt32))
    return make_error("index file '{}' has dtype code {} ({}) (field 'dtype'); token ids are read as uint8 (1), "
                      "uint16 (8) or int32 (4), as preprocess_data.py writes them",
                      idx, code, h.dtype ? h.dtype->name : "unknown");
  h.sequences = read_le<std::uint64_t>(b, 18);
  h.documents = read_le<std::uint64_t>(b, 26);
  // 4 + 8 bytes per sequence and 8 per document follow the header; counts
  // that cannot fit the file are refused before any arithmetic can overflow.
  const std::size_t rest = b.size() - kMegatronIndexHeaderBytes;
  if (h.sequences > rest / 12 || h.documents > rest / 8)
    return make_error("index file '{}' is {} bytes, too short for its header's sequence count {} and document "
                      "count {} (fields 'sequence_count', 'document_count'); the file is truncated or corrupt: write "
                      "it again",
                      idx, b.size(), h.sequences, h.documents);
  if (h.sequences * 12 + h.documents * 8 != rest)
    return make_error("index file '{}' is {} bytes, but its header's sequence count {} and document count {} "
                      "(fields 'sequence_count', 'document_count') need {} bytes; the file is {}: write it again",
                      idx, b.size(), h.sequences, h.documents,
                      kMegatronIndexHeaderBytes + h.sequences * 12 + h.documents * 8,
                      h.sequences * 12 + h.documents * 8 > rest ? "truncated"
                                                                : "corrupt (or multimodal, which is not read)");
  h.lengths_at = kMegatronIndexHeaderBytes;
  h.pointers_at = h.lengths_at + 4 * h.sequences;
  h.documents_at = h.pointers_at + 8 * h.sequences;
  return h;
}

// The tokens of all sequences, which lie back to back in .bin: the pointers
// are the running byte sum.
Result<std::uint64_t> sequence_tokens(const std::string& idx, std::span<const std::uint8_t> b, const MegatronIndex& h) {
  std::uint64_t total = 0;
  for (std::uint64_t s = 0; s < h.sequences; ++s) {
    const auto length = read_le<std::int32_t>(b, h.lengths_at + 4 * s);
    if (length < 0)
      return make_error("index file '{}': sequence_lengths[{}] is {}, negative; the index is corrupt", idx, s, length);
    const auto pointer = read_le<std::int64_t>(b, h.pointers_at + 8 * s);
    if (static_cast<std::uint64_t>(pointer) != total * h.dtype->width || pointer < 0)
      return make_error("index file '{}': sequence_pointers[{}] is {}, but the sequences before it end at byte {}; "
                        "meshtrain reads sequences stored back to back as preprocess_data.py writes them: the index "
                        "is corrupt or was rewritten",
                        idx, s, pointer, total * h.dtype->width);
    total += static_cast<std::uint64_t>(length);
  }
  return total;
}

// Each document's first token. Document k spans sequences [indices[k],
// indices[k+1]); its first token is the lengths summed before sequence
// indices[k] (pointer / width), or `total` past the last sequence.
Result<std::vector<std::uint64_t>> document_starts(const std::string& idx, std::span<const std::uint8_t> b,
                                                   const MegatronIndex& h, std::uint64_t total) {
  const auto index_at = [&](std::uint64_t k) { return read_le<std::int64_t>(b, h.documents_at + 8 * k); };
  const auto sequences = static_cast<std::int64_t>(h.sequences);
  if (h.documents < 1 || index_at(0) != 0 || index_at(h.documents - 1) != sequences)
    return make_error("index file '{}': document_indices must run from 0 to the sequence count {} (field "
                      "'document_indices'), got {} entries{}; the index is corrupt",
                      idx, h.sequences, h.documents,
                      h.documents < 1 ? std::string()
                                      : fmt::format(" from {} to {}", index_at(0), index_at(h.documents - 1)));
  std::vector<std::uint64_t> starts;
  starts.reserve(h.documents - 1);
  std::int64_t previous = 0;
  for (std::uint64_t k = 0; k + 1 < h.documents; ++k) {
    const std::int64_t first = index_at(k);
    if (first < previous || first > sequences)
      return make_error("index file '{}': document_indices[{}] is {}, outside [{}, {}] (field 'document_indices': "
                        "they rise from 0 to the sequence count); the index is corrupt",
                        idx, k, first, previous, h.sequences);
    previous = first;
    starts.push_back(first == sequences ? total
                                        : static_cast<std::uint64_t>(read_le<std::int64_t>(
                                              b, h.pointers_at + 8 * static_cast<std::size_t>(first))) /
                                              h.dtype->width);
  }
  return starts;
}

Status load_megatron(TokenDataset& d, const std::shared_ptr<const MappedFile>& index) {
  const std::string idx = d.path + ".idx";
  const std::span<const std::uint8_t> b = index->bytes();
  MT_ASSIGN(const MegatronIndex h, read_megatron_header(idx, b));
  MT_ASSIGN(const std::uint64_t total, sequence_tokens(idx, b, h));
  MT_ASSIGN(d.document_starts, document_starts(idx, b, h, total));
  const std::size_t bin_bytes = d.file->bytes().size();
  if (bin_bytes != total * h.dtype->width)
    return make_error("data file '{}' holds {} bytes, but its index '{}' lists {} tokens of {} ({} bytes; field "
                      "'sequence_lengths'); the .bin is {}: write the pair again",
                      d.tokens_file, bin_bytes, idx, total, h.dtype->name, total * h.dtype->width,
                      bin_bytes < total * h.dtype->width ? "truncated" : "longer than its index");
  d.tokens = TokenSpan(d.file->bytes().data(), total, h.dtype->width);
  d.signed_ids = h.dtype->code == kMegatronInt32;
  return ok_status();
}

// Validation split: the byte reader's rule, then (with documents) back to the
// start of the document the split falls in while training keeps a sequence.
std::size_t held_out_tokens(const TokenDataset& d, int seq_len) {
  const std::size_t n = d.tokens.size(), val = validation_bytes(n, seq_len);
  const std::size_t split = n - val;
  auto after = std::upper_bound(d.document_starts.begin(), d.document_starts.end(), split);
  if (after == d.document_starts.begin()) return val;
  const std::uint64_t start = *std::prev(after);
  return start >= static_cast<std::uint64_t>(seq_len) + 1 ? n - start : val;
}

}  // namespace

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path, const std::string& what) {
  if (!is_file(path))
    return make_error("{} '{}' does not exist or is not a regular file; check the --data path", what, path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot read {} '{}': {}; check its permissions", what, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error("cannot read {} '{}': {}", what, path, std::strerror(err));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->size_ = static_cast<std::size_t>(st.st_size);
  // mmap refuses length 0; an empty file is an empty view.
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error("cannot map {} '{}' ({} bytes) into memory: {}", what, path, m->size_, std::strerror(err));
    }
    m->data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return std::shared_ptr<const MappedFile>(std::move(m));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

DataSource identify_data(const std::string& data) {
  std::string prefix = data;
  if (ends_with(data, ".bin") || ends_with(data, ".idx")) prefix = data.substr(0, data.size() - 4);
  if (ends_with(data, ".idx") || is_file(prefix + ".idx")) return {DataFormat::megatron, prefix};
  if (!is_file(data) && is_file(prefix + ".bin")) return {DataFormat::megatron, prefix};
  if (is_file(data) && is_llmc_magic(leading_int32(data))) return {DataFormat::llmc, data};
  return {DataFormat::bytes, data};
}

Result<TokenDataset> load_token_dataset(const DataSource& s, int seq_len) {
  if (seq_len < 1) return make_error("--seq-len must be at least 1, got {}", seq_len);
  TokenDataset d;
  d.format = s.format;
  d.path = s.path;
  if (s.format == DataFormat::llmc) {
    d.tokens_file = s.path;
    MT_ASSIGN(d.file, MappedFile::open(s.path, "token file"));
    MT_TRY(load_llmc(d));
  } else {
    d.tokens_file = s.path + ".bin";
    // Both halves must be there: name the missing one.
    for (const std::string& part : {s.path + ".idx", d.tokens_file})
      if (!is_file(part))
        return make_error("Megatron dataset '{}' needs '{}' and '{}', but '{}' does not exist; pass the PREFIX of a "
                          ".bin/.idx pair written by tools/preprocess_data.py",
                          s.path, s.path + ".bin", s.path + ".idx", part);
    MT_ASSIGN(auto index, MappedFile::open(s.path + ".idx", "index file"));
    MT_ASSIGN(d.file, MappedFile::open(d.tokens_file, "data file"));
    MT_TRY(load_megatron(d, index));
  }
  MT_TRY(check_length(d.tokens_file, d.tokens.size(), seq_len));
  d.max_id = max_token(d.tokens);
  d.val_size = held_out_tokens(d, seq_len);
  return d;
}

Status write_llmc_tokens(const std::string& path, std::span<const std::uint32_t> ids, std::uint32_t vocab) {
  if (ids.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    return make_error("{} tokens do not fit an llm.c token file (its header counts them in an int32, at most {}); "
                      "split the text into several files",
                      ids.size(), std::numeric_limits<std::int32_t>::max());
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab) return make_error("token {} is id {}, past the vocabulary of {}", i, ids[i], vocab);
  const bool narrow = vocab <= 65536;
  std::vector<std::int32_t> header(kLlmcHeaderBytes / 4, 0);
  header[0] = narrow ? kLlmcMagicGpt2 : kLlmcMagicLlama3;
  header[1] = narrow ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
  header[2] = static_cast<std::int32_t>(ids.size());
  std::vector<std::uint16_t> ids16;
  if (narrow) ids16.assign(ids.begin(), ids.end());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error("cannot create token file '{}': {}; pass a writable --out path", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(kLlmcHeaderBytes));
    if (narrow)
      out.write(reinterpret_cast<const char*>(ids16.data()), static_cast<std::streamsize>(2 * ids16.size()));
    else
      out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(4 * ids.size()));
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return make_error("cannot write token file '{}': {}", tmp, why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return make_error("cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
  return ok_status();
}

Result<std::vector<std::uint32_t>> read_llmc_tokens(const std::string& path) {
  if (!is_file(path)) return make_error("token file '{}' does not exist or is not a regular file", path);
  if (!is_llmc_magic(leading_int32(path)))
    return make_error("'{}' is not an llm.c token file (it does not start with magic {} or {}); pass a file that "
                      "`meshtrain tokenize encode` wrote",
                      path, kLlmcMagicGpt2, kLlmcMagicLlama3);
  TokenDataset d;
  d.path = d.tokens_file = path;
  MT_ASSIGN(d.file, MappedFile::open(path, "token file"));
  MT_TRY(load_llmc(d));
  std::vector<std::uint32_t> ids(d.tokens.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = d.tokens[i];
  return ids;
}

Status check_token_vocab(const TokenDataset& d, int vocab, const std::string& model) {
  if (d.max_id < static_cast<std::uint32_t>(vocab)) return ok_status();
  // Only a refusal pays for the second pass that finds where.
  std::size_t at = 0;
  while (d.tokens[at] < static_cast<std::uint32_t>(vocab)) ++at;
  if (d.signed_ids && d.tokens[at] > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()))
    return make_error("token file '{}' holds token id {} (token {}); ids must be in [0, vocab): the file is corrupt",
                      d.tokens_file, static_cast<std::int32_t>(d.tokens[at]), at);
  if (d.signed_ids && d.max_id > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()))
    return make_error("token file '{}' holds token id {} (token {}), but model '{}' has vocab {}, and negative ids "
                      "elsewhere; the file is corrupt",
                      d.tokens_file, d.tokens[at], at, model, vocab);
  return make_error("token file '{}' holds token id {} (token {}; the largest is {}), but model '{}' has vocab {}; "
                    "use a model with \"vocab\" of at least {}, or tokenize the data with the model's tokenizer",
                    d.tokens_file, d.tokens[at], at, d.max_id, model, vocab, static_cast<std::uint64_t>(d.max_id) + 1);
}

}  // namespace meshtrain
