#include "engine/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/counter_rng.h"

namespace meshtrain {

namespace {

std::size_t argmax(std::span<const float> logits) {
  // std::max_element keeps the first of equal maxima: the lowest id.
  return static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

Status check_sampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    return make_error("--temperature must be finite and >= 0 (0 is greedy), got {}", o.temperature);
  if (o.top_k < 0) return make_error("--top-k must be >= 0 (0 keeps every token), got {}", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1))
    return make_error("--top-p must be in (0, 1] (1 keeps every token), got {}", o.top_p);
  return ok_status();
}

std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingOptions& o) {
  std::vector<double> p(logits.size(), 0.0);
  if (logits.empty()) return p;
  if (o.temperature == 0) {
    p[argmax(logits)] = 1.0;
    return p;
  }
  const double top = logits[argmax(logits)];
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - top) / o.temperature);
  for (double& v : p) v /= sum;
  // Most probable first, the lower id first among equals: the filters' order.
  std::vector<std::size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
  std::size_t keep = o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), p.size()) : p.size();
  if (o.top_p < 1) {
    // The smallest prefix whose mass reaches top_p (of what top-k kept, renormalised).
    double kept_mass = 0;
    for (std::size_t i = 0; i < keep; ++i) kept_mass += p[order[i]];
    double cumulative = 0;
    std::size_t nucleus = 0;
    while (nucleus < keep && cumulative < o.top_p * kept_mass) cumulative += p[order[nucleus++]];
    keep = std::max<std::size_t>(nucleus, 1);
  }
  double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += p[order[i]];
  for (std::size_t i = 0; i < order.size(); ++i) p[order[i]] = i < keep ? p[order[i]] / kept : 0.0;
  return p;
}

double sampling_uniform(std::uint64_t seed, std::uint64_t step) {
  // 53 random bits: every double in [0, 1) on a grid of 2^-53.
  return static_cast<double>(mix64(mix64(seed) ^ mix64(step + 1)) >> 11) * 0x1.0p-53;
}

Result<std::int32_t> Sampler::next(std::span<const float> logits, std::uint64_t step) const {
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      return make_error("the model gave a non-finite logit ({}) for token {}; its parameters may be damaged",
                        logits[i], i);
  if (o_.temperature == 0) return static_cast<std::int32_t>(argmax(logits));
  const std::vector<double> p = sampling_probabilities(logits, o_);
  const double u = sampling_uniform(o_.seed, step);
  double cumulative = 0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    last = i;
    cumulative += p[i];
    if (u < cumulative) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(last);  // u within rounding of 1
}

}  // namespace meshtrain
