// Vocab-parallel softmax cross-entropy in phases (see backends/backend.h).
// Legend: N rows, V this shard's vocabulary; columns are global ids
// [vocab_offset, vocab_offset + V).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cpu/kernels/fast_math.h"
#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

template <class T>
void cross_entropy_max(std::int64_t N, std::int64_t V, const T* logits, T* row_max) {
  for_rows(N, V, [&](std::int64_t r) {
    const T* l = logits + r * V;
    T m = -std::numeric_limits<T>::infinity();
    for (std::int64_t j = 0; j < V; ++j) m = l[j] > m ? l[j] : m;
    row_max[r] = m;
  });
}

template <class T>
void cross_entropy_partials(std::int64_t N, std::int64_t V, const T* logits,
                            const std::int32_t* targets, const T* row_max,
                            std::int64_t vocab_offset, T* sumexp, T* target_logit) {
  for_rows(N, V, [&](std::int64_t r) {
    const T* l = logits + r * V;
    const T m = row_max[r];
    // The exps a block at a time (that loop vectorizes), then their sum in
    // index order in double (which does not).
    constexpr std::int64_t kBlock = 256;
    T e[kBlock];
    double z = 0.0;
    for (std::int64_t j0 = 0; j0 < V; j0 += kBlock) {
      const std::int64_t n = std::min(kBlock, V - j0);
      for (std::int64_t j = 0; j < n; ++j) e[j] = exp_approx(l[j0 + j] - m);
      for (std::int64_t j = 0; j < n; ++j) z += static_cast<double>(e[j]);
    }
    sumexp[r] = static_cast<T>(z);
    const std::int64_t t = static_cast<std::int64_t>(targets[r]) - vocab_offset;
    target_logit[r] = (t >= 0 && t < V) ? l[t] : T(0);
  });
}

template <class T>
void cross_entropy_loss(std::int64_t N, const T* row_max, const T* sumexp, const T* target_logit,
                        T* losses) {
  for_chunks(N, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r)
      losses[r] = std::log(sumexp[r]) + row_max[r] - target_logit[r];
  });
}

// dlogits (N, V) = dloss · (softmax - onehot(target)), overwritten.
template <class T>
void cross_entropy_backward(std::int64_t N, std::int64_t V, const T* logits,
                            const std::int32_t* targets, const T* row_max, const T* sumexp,
                            std::int64_t vocab_offset, T dloss, T* dlogits) {
  for_rows(N, V, [&](std::int64_t r) {
    const T* l = logits + r * V;
    T* d = dlogits + r * V;
    const T m = row_max[r];
    const T inv = T(1) / sumexp[r];
    for (std::int64_t j = 0; j < V; ++j) d[j] = dloss * (exp_approx(l[j] - m) * inv);
    const std::int64_t t = static_cast<std::int64_t>(targets[r]) - vocab_offset;
    if (t >= 0 && t < V) d[t] -= dloss;
  });
}

}  // namespace meshtrain::cpu
