// ByteDataset: byte-level tokenization of any file, split into training and
// held-out validation bytes.
//
// The vocabulary is the 256 byte values: token = byte, so every file is valid
// input and there is no tokenizer to ship. The last 10% of the file's bytes
// (but at least one sequence worth, seq_len + 1 bytes) is the validation split;
// the rest is the training split. A sequence of T tokens needs T + 1 bytes
// (inputs plus the targets shifted by one), so a file needs at least
// 2·(T + 1) bytes: one sequence for each split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

inline constexpr int kByteVocab = 256;

struct ByteDataset {
  std::string path;
  std::vector<std::uint8_t> bytes;  // the whole file; the splits view it

  std::size_t val_size = 0;  // bytes at the end held out for validation
  std::span<const std::uint8_t> train() const {
    return std::span(bytes).first(bytes.size() - val_size);
  }
  std::span<const std::uint8_t> val() const { return std::span(bytes).last(val_size); }
};

// Bytes held out for validation from a file of `file_bytes` bytes:
// max(file_bytes / 10, seq_len + 1).
std::size_t validation_bytes(std::size_t file_bytes, int seq_len);

// Reads `path` whole. Errors name the file and the fix: missing, not a regular
// file, unreadable, empty, or too short for one sequence of `seq_len` tokens in
// each split.
Result<ByteDataset> load_byte_dataset(const std::string& path, int seq_len);

}  // namespace meshtrain
