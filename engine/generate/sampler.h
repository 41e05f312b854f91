// Sampler: the next token from a row of logits, greedy or drawn with a
// temperature, top-k and top-p (nucleus) filtering, as Hugging Face's
// generate() composes them: the logits are divided by the temperature, the
// softmax taken, only the k most probable tokens kept, then only the
// smallest set of the most probable whose probabilities sum to at least p
// (Holtzman et al. 2020), and the survivors renormalised.
//
// Temperature 0 is greedy: the largest logit, the lowest id on a tie. A
// draw is a pure function of (seed, step): draw t uses the uniform number
// mix64-hashed from the seed and t (backends/counter_rng.h), so the same
// seed gives the same text on every machine and backend that computes the
// same logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace meshtrain {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: no limit
  double top_p = 1.0;        // in (0, 1]; 1: no limit
  std::uint64_t seed = 0;
};

// An Error naming the flag and its range for a negative or non-finite
// temperature, a negative top-k, or a top-p outside (0, 1].
Status check_sampling(const SamplingOptions& o);

// The probabilities the sampler draws from, one per logit: 0 for the tokens
// top-k and top-p removed, the renormalised softmax for the rest (one-hot on
// the argmax for temperature 0). Logits must be finite.
std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingOptions& o);

// The uniform number in [0, 1) of draw `step` under `seed`.
double sampling_uniform(std::uint64_t seed, std::uint64_t step);

class Sampler {
 public:
  explicit Sampler(SamplingOptions o) : o_(o) {}
  // The token of draw `step` (0, 1, ...) from `logits`; an Error for a
  // non-finite logit (a damaged checkpoint).
  Result<std::int32_t> next(std::span<const float> logits, std::uint64_t step) const;

 private:
  SamplingOptions o_;
};

}  // namespace meshtrain
