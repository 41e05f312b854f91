// DataLoader: deterministic batches of token sequences drawn from one split.
//
// Each sequence starts at a random offset in the split, and the randomness is
// counter-based: sequence number i (counted over the whole data-parallel group)
// starts at offset(seed, i) = uniform(splitmix64 of (seed, i)) in
// [0, tokens - seq - 1]. The loader's whole position is therefore the counter
// `draws`, which a checkpoint saves and `restore` puts back.
//
// Data parallelism: every call to next(B, T) consumes a block of B·dp draws;
// the loader of data-parallel rank r takes draws [r·B, (r+1)·B) of that block.
// So ranks get disjoint draws, the rank batches concatenated in rank order are
// exactly the batch a dp=1 loader with B·dp rows returns, and all ranks hold the
// same `draws` after each call (one saved state serves every rank, and stays
// valid under another dp with the same global batch). `dp_rank` is the rank's
// data-parallel coordinate: tensor- and pipeline-parallel peers pass the same
// one and so see the same data.
//
// Sampling is with replacement (there are no epochs): two draws may land on the
// same offset by chance, as in nanoGPT's loader.
//
// Batch layout (B, T) row-major: ids[b·T + t] = tokens[o_b + t] and
// targets[b·T + t] = tokens[o_b + t + 1].
//
// The tokens are a TokenSpan: bytes (a ByteDataset, token = byte) or the
// little-endian 2- or 4-byte ids of a token file (engine/data/token_dataset.h),
// read in place from its memory mapping.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <vector>

#include "core/status.h"

namespace meshtrain {

// Token files are little-endian; reading them in place assumes the host is too.
static_assert(std::endian::native == std::endian::little, "token files are read in place as little-endian");

// A borrowed run of `size()` token ids of `width` bytes each (1, 2 or 4,
// unsigned). Views of it view the same memory.
class TokenSpan {
 public:
  TokenSpan() = default;
  // Bytes are tokens as they are (vocabulary 256): implicit, as a span converts.
  TokenSpan(std::span<const std::uint8_t> bytes) : data_(bytes.data()), count_(bytes.size()), width_(1) {}
  TokenSpan(const std::vector<std::uint8_t>& bytes) : TokenSpan(std::span<const std::uint8_t>(bytes)) {}
  TokenSpan(const std::uint8_t* data, std::size_t count, int width) : data_(data), count_(count), width_(width) {}

  std::size_t size() const { return count_; }
  int width() const { return width_; }
  std::uint32_t operator[](std::size_t i) const {
    const std::uint8_t* p = data_ + i * static_cast<std::size_t>(width_);
    if (width_ == 1) return *p;
    if (width_ == 2) {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  TokenSpan first(std::size_t n) const { return {data_, n, width_}; }
  TokenSpan last(std::size_t n) const { return {data_ + (count_ - n) * static_cast<std::size_t>(width_), n, width_}; }
  // The tokens' bytes as stored.
  std::span<const std::uint8_t> bytes() const { return {data_, count_ * static_cast<std::size_t>(width_)}; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t count_ = 0;
  int width_ = 1;
};

struct Batch {
  int rows = 0;                       // B
  int seq = 0;                        // T
  std::vector<std::int32_t> ids;      // (B, T)
  std::vector<std::int32_t> targets;  // (B, T), ids shifted by one
};

struct LoaderState {
  std::uint64_t seed = 0;
  std::uint64_t draws = 0;  // sequences drawn so far by the whole data-parallel group
  bool operator==(const LoaderState&) const = default;
};

nlohmann::json loader_state_to_json(const LoaderState& s);
Result<LoaderState> loader_state_from_json(const nlohmann::json& j);

// The counter-based randomness every loader shares: draw `index` of the stream
// keyed by `seed` mapped uniformly onto [0, range) (range >= 1), the same on
// every machine and for every dp. Pure: no state to save beyond the counter.
std::uint64_t uniform_draw(std::uint64_t seed, std::uint64_t index, std::uint64_t range);

class DataLoader {
 public:
  // `tokens` is borrowed: it must outlive the loader (a dataset's split).
  DataLoader(TokenSpan tokens, std::uint64_t seed, int dp_rank = 0, int dp = 1);

  // The next `batch` sequences of `seq` tokens for this rank. Errors if the
  // split is shorter than seq + 1 tokens or the sizes are not positive.
  Result<Batch> next(int batch, int seq);

  LoaderState state() const { return state_; }
  void restore(const LoaderState& s) { state_ = s; }

  // The start offset of global draw `index`: exposed so tests and tools can
  // see which sequences a run used.
  std::uint64_t offset_of(std::uint64_t index, int seq) const;

 private:
  TokenSpan tokens_;
  int dp_rank_;
  int dp_;
  LoaderState state_;
};

// The fixed validation set: the first `max_sequences` non-overlapping
// sequences of the split (sequence k starts at k·seq), in order, grouped into
// batches of `batch` rows. The last batch may have fewer rows; average the loss
// per token so it weighs right. Fewer sequences are returned when the split
// holds fewer; at least one when it has seq + 1 tokens.
Result<std::vector<Batch>> validation_batches(TokenSpan tokens, int batch,
                                              int seq, int max_sequences);

}  // namespace meshtrain
