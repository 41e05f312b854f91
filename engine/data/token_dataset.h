// TokenDataset: files of token ids written by a tokenizer, read in place.
//
// `train --data` names one of three things (identify_data):
//   - an llm.c token file (dev/data/data_common.py write_datafile): a header of
//     256 little-endian int32 (1024 bytes; [0] magic, [1] version, [2] token
//     count N), then N tokens: magic 20240520 version 1 = uint16 ids (GPT-2),
//     magic 20240801 version 7 = uint32 ids (Llama 3). Recognised by the magic.
//   - a Megatron-LM indexed dataset, PREFIX.bin + PREFIX.idx
//     (megatron/core/datasets/indexed_dataset.py), named by PREFIX, PREFIX.bin
//     or PREFIX.idx. The .idx: b"MMIDIDX\0\0", u64 version 1, u8 dtype code
//     (1 uint8, 8 uint16, 4 int32 are read), u64 sequence count S, u64
//     document count D, then int32 sequence_lengths[S], int64
//     sequence_pointers[S] (byte offsets into .bin), int64 document_indices[D]
//     (sequence index where each document starts, 0 first and S last). The
//     .bin holds the sequences back to back.
//   - any other file: its bytes are the tokens (engine/data/byte_dataset.h).
//
// Token files are memory-mapped read-only, never copied: the loader reads the
// ids where they lie. The tokens form one stream in file order; a training
// sample is any seq + 1 consecutive tokens of the training split, so samples
// cross document boundaries as Megatron's GPTDataset does by default (a
// tokenizer that appends an end-of-document token separates them).
//
// The held-out validation split is the last max(N/10, seq + 1) tokens, as for
// bytes; a Megatron dataset moves the split back to the start of the document
// it falls in (when the training split keeps one sequence), so validation
// documents are whole and never trained on.
//
// Every id is checked against the model's vocabulary once, when the data is
// opened: one sequential pass over the mapping (memory bandwidth: about a
// second for a few GB), so a bad file fails before the first step instead of
// hours in, and no id past the embedding table ever reaches a lookup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/data/data_loader.h"

namespace meshtrain {

// llm.c's header: 256 int32; the magic and version per token width.
inline constexpr std::size_t kLlmcHeaderBytes = 256 * 4;
inline constexpr std::int32_t kLlmcMagicGpt2 = 20240520;    // version 1: uint16 tokens
inline constexpr std::int32_t kLlmcVersionGpt2 = 1;
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // version 7: uint32 tokens
inline constexpr std::int32_t kLlmcVersionLlama3 = 7;

// Megatron's .idx: 9 magic bytes, u64 version, u8 dtype, u64 S, u64 D.
inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::size_t kMegatronIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;
inline constexpr std::uint8_t kMegatronUint8 = 1, kMegatronInt32 = 4, kMegatronUint16 = 8;

// A whole file mapped read-only; unmapped when the last owner lets go.
class MappedFile {
 public:
  // Errors name the file as `what` ('token file', 'index file', ...).
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile() = default;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

enum class DataFormat { bytes, llmc, megatron };

// What `--data` names. `path` is the file (bytes, llm.c) or the PREFIX
// (Megatron, without .bin/.idx).
struct DataSource {
  DataFormat format = DataFormat::bytes;
  std::string path;
};

// Megatron when PREFIX.idx (PREFIX being `data` less a .bin/.idx suffix)
// exists or `data` ends in .idx, llm.c when the file starts with an llm.c
// magic, bytes otherwise (missing files too: the byte reader names them).
DataSource identify_data(const std::string& data);

struct TokenDataset {
  DataFormat format = DataFormat::llmc;
  std::string path;         // what --data named: the file, or the Megatron PREFIX
  std::string tokens_file;  // the file the ids are in: path, or PREFIX.bin
  std::shared_ptr<const MappedFile> file;  // tokens_file, mapped
  TokenSpan tokens;                        // every id, in file order
  bool signed_ids = false;                 // Megatron int32: ids are read as int32
  std::uint32_t max_id = 0;                // the largest id (as unsigned: a negative int32 is huge)
  // Megatron: the token offset of each document's first token (documents
  // may be empty); llm.c: empty (the file is one stream).
  std::vector<std::uint64_t> document_starts;

  std::size_t val_size = 0;  // tokens at the end held out for validation
  TokenSpan train() const { return tokens.first(tokens.size() - val_size); }
  TokenSpan val() const { return tokens.last(val_size); }
};

// Maps and checks a token dataset (`s.format` llmc or megatron). Refusals
// name the file and the field: truncated or corrupt header or index, unknown
// version or dtype, sizes that disagree, too few tokens for one sequence of
// `seq_len` in each split.
Result<TokenDataset> load_token_dataset(const DataSource& s, int seq_len);

// Writes an llm.c token file (the header above, then the ids): uint16 ids
// (magic 20240520) when every id fits, i.e. `vocab` <= 65536, else uint32
// (magic 20240801). Written as PATH.tmp and renamed, so a failed write never
// leaves a truncated file under the name. Refuses more than 2^31 - 1 tokens
// (header[2] is an int32) and ids at or past `vocab`.
Status write_llmc_tokens(const std::string& path, std::span<const std::uint32_t> ids, std::uint32_t vocab);

// Every id of an llm.c token file, checked as load_token_dataset checks it
// (header, version, size), without its length needs: what decoding reads.
Result<std::vector<std::uint32_t>> read_llmc_tokens(const std::string& path);

// Every id below `vocab` (the model's), else an error naming the file, the
// first id too large and its position.
Status check_token_vocab(const TokenDataset& d, int vocab, const std::string& model);

}  // namespace meshtrain
