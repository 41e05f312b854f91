// Elementwise ops and whole-tensor reductions over a scalar type T (float
// for the backend, double for fp64 references in tests).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

template <class T>
void fill(std::int64_t n, T* x, T value) {
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) x[i] = value;
  });
}

// out may alias a or b: each element is read before it is written.
template <class T>
void add(std::int64_t n, const T* a, const T* b, T* out) {
  for_chunks(n, kGrain, [&](std::int64_t s, std::int64_t e) {
    for (std::int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

template <class T>
void scale(std::int64_t n, T* x, T alpha) {
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) x[i] *= alpha;
  });
}

template <class T>
void axpy(std::int64_t n, T alpha, const T* x, T* y) {
  for_chunks(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
  });
}

template <class T>
double sum(std::int64_t n, const T* x) {
  return reduce_chunks(n, [&](std::int64_t b, std::int64_t e) {
    double s = 0.0;
    for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]);
    return s;
  });
}

// Σ x[i]² for i in [b, e), in index order, in double.
template <class T>
double sum_squares_range(const T* x, std::int64_t b, std::int64_t e) {
  double s = 0.0;
  for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

// sums[a] = Σ xs[a][i]² over i < ns[a] for each array: its kGrain chunks'
// sums (each in index order) added in chunk order, as reduce_chunks does,
// in one parallel loop over all the arrays' chunks. Four whole chunks at a
// time run their sums interleaved, each still in its own order, so that the
// add latency does not bound the loop.
template <class T>
void foreach_sum_squares(std::size_t arrays, const T* const* xs, const std::int64_t* ns, double* sums) {
  const std::vector<ArrayChunk> chunks = array_chunks(arrays, [&](std::size_t a) { return ns[a]; });
  std::vector<double> parts(chunks.size());
  constexpr std::size_t kLanes = 4;
  const auto groups = static_cast<std::int64_t>((chunks.size() + kLanes - 1) / kLanes);
  for_chunks(groups, 1, [&](std::int64_t gb, std::int64_t ge) {
    for (std::int64_t g = gb; g < ge; ++g) {
      const std::size_t first = static_cast<std::size_t>(g) * kLanes;
      const std::size_t count = std::min(kLanes, chunks.size() - first);
      bool whole = count == kLanes;
      for (std::size_t l = 0; l < count; ++l) whole = whole && chunks[first + l].end - chunks[first + l].begin == kGrain;
      if (!whole) {
        for (std::size_t l = 0; l < count; ++l) {
          const ArrayChunk& k = chunks[first + l];
          parts[first + l] = sum_squares_range(xs[k.array], k.begin, k.end);
        }
        continue;
      }
      const T* p0 = xs[chunks[first].array] + chunks[first].begin;
      const T* p1 = xs[chunks[first + 1].array] + chunks[first + 1].begin;
      const T* p2 = xs[chunks[first + 2].array] + chunks[first + 2].begin;
      const T* p3 = xs[chunks[first + 3].array] + chunks[first + 3].begin;
      double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
      for (std::int64_t i = 0; i < kGrain; ++i) {
        s0 += static_cast<double>(p0[i]) * static_cast<double>(p0[i]);
        s1 += static_cast<double>(p1[i]) * static_cast<double>(p1[i]);
        s2 += static_cast<double>(p2[i]) * static_cast<double>(p2[i]);
        s3 += static_cast<double>(p3[i]) * static_cast<double>(p3[i]);
      }
      parts[first] = s0, parts[first + 1] = s1, parts[first + 2] = s2, parts[first + 3] = s3;
    }
  });
  for (std::size_t a = 0; a < arrays; ++a) sums[a] = 0.0;
  for (std::size_t c = 0; c < chunks.size(); ++c) sums[chunks[c].array] += parts[c];
}

template <class T>
double sum_squares(std::int64_t n, const T* x) {
  double s = 0.0;
  foreach_sum_squares<T>(1, &x, &n, &s);
  return s;
}

// db (n) += column sums of dy (m, n).
template <class T>
void bias_backward(std::int64_t m, std::int64_t n, const T* dy, T* db) {
  std::vector<double> acc(static_cast<std::size_t>(n), 0.0);
  reduce_rows(
      m, n,
      [&](std::int64_t r, double* a) {
        const T* row = dy + r * n;
        for (std::int64_t j = 0; j < n; ++j) a[j] += static_cast<double>(row[j]);
      },
      acc.data());
  for (std::int64_t j = 0; j < n; ++j) db[j] = static_cast<T>(static_cast<double>(db[j]) + acc[j]);
}

}  // namespace meshtrain::cpu
