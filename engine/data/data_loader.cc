#include "engine/data/data_loader.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/json_input.h"

namespace meshtrain {
namespace {

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64's i-th output for a state derived from the seed; mixing the seed
// first keeps nearby seeds from giving shifted copies of one stream.
std::uint64_t draw_bits(std::uint64_t seed, std::uint64_t index) {
  return mix64(mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ull);
}

}  // namespace

std::uint64_t uniform_draw(std::uint64_t seed, std::uint64_t index, std::uint64_t range) {
  // Multiply-high maps 64 random bits onto [0, range) without a division.
  return static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(draw_bits(seed, index)) * range) >> 64);
}

namespace {

Status check_sizes(std::size_t tokens, int batch, int seq) {
  if (batch < 1 || seq < 1) {
    return make_error("batch and sequence length must be positive, got batch {} and seq {}", batch,
                      seq);
  }
  if (tokens < static_cast<std::size_t>(seq) + 1) {
    return make_error("the split has {} tokens, but one sequence of {} tokens needs {}", tokens,
                      seq, seq + 1);
  }
  return ok_status();
}

void append_sequence(Batch& b, TokenSpan tokens, std::uint64_t offset) {
  // Ids below the model's vocabulary (checked when the data was opened) fit an int32.
  for (int t = 0; t < b.seq; ++t) {
    b.ids.push_back(static_cast<std::int32_t>(tokens[offset + t]));
    b.targets.push_back(static_cast<std::int32_t>(tokens[offset + t + 1]));
  }
  ++b.rows;
}

}  // namespace

nlohmann::json loader_state_to_json(const LoaderState& s) {
  return {{"seed", s.seed}, {"draws", s.draws}};
}

Result<LoaderState> loader_state_from_json(const nlohmann::json& j) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  MT_ASSIGN(const JsonFields f, JsonFields::of(j, "data-loader field",
                                               "data-loader state must be an object with unsigned 'seed' and 'draws'"));
  if (!f.has("seed") || !f.has("draws"))
    return make_error("data-loader state must be an object with unsigned 'seed' and 'draws', got {}", json_excerpt(j));
  LoaderState s;
  MT_TRY(f.get_uint64("seed", kMax, s.seed));
  MT_TRY(f.get_uint64("draws", kMax, s.draws));
  return s;
}

DataLoader::DataLoader(TokenSpan tokens, std::uint64_t seed, int dp_rank,
                       int dp)
    : tokens_(tokens), dp_rank_(dp_rank), dp_(dp), state_{seed, 0} {
  // The mesh hands out coordinates; a rank outside the group is a caller bug.
  assert(dp >= 1 && dp_rank >= 0 && dp_rank < dp);
}

std::uint64_t DataLoader::offset_of(std::uint64_t index, int seq) const {
  // Offsets 0 .. tokens - seq - 1 leave room for the shifted target.
  return uniform_draw(state_.seed, index, tokens_.size() - static_cast<std::uint64_t>(seq));
}

Result<Batch> DataLoader::next(int batch, int seq) {
  MT_TRY(check_sizes(tokens_.size(), batch, seq));
  Batch b;
  b.seq = seq;
  b.ids.reserve(static_cast<std::size_t>(batch) * seq);
  b.targets.reserve(b.ids.capacity());
  const std::uint64_t first = state_.draws + static_cast<std::uint64_t>(dp_rank_) * batch;
  for (int i = 0; i < batch; ++i) append_sequence(b, tokens_, offset_of(first + i, seq));
  state_.draws += static_cast<std::uint64_t>(batch) * dp_;
  return b;
}

Result<std::vector<Batch>> validation_batches(TokenSpan tokens, int batch,
                                              int seq, int max_sequences) {
  MT_TRY(check_sizes(tokens.size(), batch, seq));
  if (max_sequences < 1)
    return make_error("validation needs at least one sequence, got {}", max_sequences);
  // Sequence k reads tokens [k·seq, k·seq + seq], so k·seq + seq + 1 <= tokens.
  const std::size_t fit = (tokens.size() - 1) / seq;
  const std::size_t count = std::min(fit, static_cast<std::size_t>(max_sequences));
  std::vector<Batch> out;
  for (std::size_t k = 0; k < count; ++k) {
    if (k % batch == 0) {
      out.emplace_back();
      out.back().seq = seq;
    }
    append_sequence(out.back(), tokens, k * seq);
  }
  return out;
}

}  // namespace meshtrain
