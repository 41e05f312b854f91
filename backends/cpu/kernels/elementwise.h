// Elementwise ops and whole-tensor reductions over a scalar type T (float
// for the backend, double for fp64 references in tests).
#pragma once

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

template <class T>
double sum_squares(std::int64_t n, const T* x) {
  return reduce_chunks(n, [&](std::int64_t b, std::int64_t e) {
    double s = 0.0;
    for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return s;
  });
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
