// Writers of the token files `train --data` reads (engine/data/token_dataset.h),
// for tests: llm.c's header + ids, and Megatron's PREFIX.bin + PREFIX.idx.
// They write what the formats' own writers write (llm.c's
// dev/data/data_common.py, Megatron's _IndexWriter), so a test can then
// truncate or overwrite single fields to check each refusal.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data/token_dataset.h"

namespace meshtrain::testing {

inline void append_bytes(std::string& out, const void* p, std::size_t n) {
  out.append(static_cast<const char*>(p), n);
}

template <class T>
void append_le(std::string& out, T v) {
  append_bytes(out, &v, sizeof v);  // the hosts the tests run on are little-endian (data_loader.h asserts it)
}

// ids as `width`-byte unsigned values (1, 2 or 4).
inline std::string token_bytes(const std::vector<std::uint32_t>& ids, int width) {
  std::string out;
  for (std::uint32_t id : ids) {
    if (width == 1) append_le(out, static_cast<std::uint8_t>(id));
    if (width == 2) append_le(out, static_cast<std::uint16_t>(id));
    if (width == 4) append_le(out, id);
  }
  return out;
}

// An llm.c token file: uint16 ids (magic 20240520, version 1) or, with
// `width` 4, uint32 ids (magic 20240801, version 7).
inline std::string llmc_file(const std::vector<std::uint32_t>& ids, int width = 2) {
  std::int32_t header[256] = {};
  header[0] = width == 2 ? kLlmcMagicGpt2 : kLlmcMagicLlama3;
  header[1] = width == 2 ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
  header[2] = static_cast<std::int32_t>(ids.size());
  std::string out;
  append_bytes(out, header, sizeof header);
  return out + token_bytes(ids, width);
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_llmc(const std::string& path, const std::vector<std::uint32_t>& ids, int width = 2) {
  write_bytes(path, llmc_file(ids, width));
}

// A Megatron index for `documents`, each one sequence (as preprocess_data.py
// writes a document without --split-sentences), ids of dtype `code`.
inline std::string megatron_index(const std::vector<std::vector<std::uint32_t>>& documents,
                                  std::uint8_t code = kMegatronUint16) {
  const int width = code == kMegatronUint8 ? 1 : code == kMegatronUint16 ? 2 : 4;
  std::string out;
  append_bytes(out, kMegatronIndexMagic, sizeof kMegatronIndexMagic);
  append_le<std::uint64_t>(out, 1);
  append_le<std::uint8_t>(out, code);
  append_le<std::uint64_t>(out, documents.size());      // sequences
  append_le<std::uint64_t>(out, documents.size() + 1);  // document_indices: 0, 1, ..., S
  for (const auto& d : documents) append_le<std::int32_t>(out, static_cast<std::int32_t>(d.size()));
  std::int64_t pointer = 0;
  for (const auto& d : documents) {
    append_le<std::int64_t>(out, pointer);
    pointer += static_cast<std::int64_t>(d.size()) * width;
  }
  for (std::size_t k = 0; k <= documents.size(); ++k) append_le<std::int64_t>(out, static_cast<std::int64_t>(k));
  return out;
}

inline std::string megatron_bin(const std::vector<std::vector<std::uint32_t>>& documents,
                                std::uint8_t code = kMegatronUint16) {
  const int width = code == kMegatronUint8 ? 1 : code == kMegatronUint16 ? 2 : 4;
  std::string out;
  for (const auto& d : documents) out += token_bytes(d, width);
  return out;
}

inline void write_megatron(const std::string& prefix, const std::vector<std::vector<std::uint32_t>>& documents,
                           std::uint8_t code = kMegatronUint16) {
  write_bytes(prefix + ".idx", megatron_index(documents, code));
  write_bytes(prefix + ".bin", megatron_bin(documents, code));
}

// Deterministic ids in [0, vocab): a position's id can be recomputed.
inline std::uint32_t test_id(std::size_t i, std::uint32_t vocab) {
  return static_cast<std::uint32_t>((i * 2654435761u + 12345u) % vocab);
}

inline std::vector<std::uint32_t> test_ids(std::size_t n, std::uint32_t vocab, std::size_t first = 0) {
  std::vector<std::uint32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = test_id(first + i, vocab);
  return ids;
}

}  // namespace meshtrain::testing
