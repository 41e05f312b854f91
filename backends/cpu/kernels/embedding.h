// Embedding lookup and its gradient for one vocabulary shard.
// Legend: N tokens, C width, V this shard's rows, ids global in
// [vocab_offset, vocab_offset + V) when owned.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

// out (N, C) = table (V, C)[id - vocab_offset], zero rows for ids not owned.
template <class T>
void embedding_forward(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t vocab_offset,
                       const T* table, const std::int32_t* ids, T* out) {
  for_rows(N, C, [&](std::int64_t n) {
    const std::int64_t v = static_cast<std::int64_t>(ids[n]) - vocab_offset;
    T* o = out + n * C;
    if (v >= 0 && v < V)
      std::memcpy(o, table + v * C, static_cast<std::size_t>(C) * sizeof(T));
    else
      for (std::int64_t j = 0; j < C; ++j) o[j] = T(0);
  });
}

// dtable (V, C) += Σ_{n: id_n owned} dout (N, C) row n. The tokens of each
// vocabulary row are grouped (a stable counting sort), then each row sums its
// tokens in token order in double: deterministic, no atomics, one write per row.
template <class T>
void embedding_backward(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t vocab_offset,
                        const T* dout, const std::int32_t* ids, T* dtable) {
  std::vector<std::int64_t> start(static_cast<std::size_t>(V + 1), 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t v = static_cast<std::int64_t>(ids[n]) - vocab_offset;
    if (v >= 0 && v < V) ++start[static_cast<std::size_t>(v + 1)];
  }
  for (std::int64_t v = 0; v < V; ++v)
    start[static_cast<std::size_t>(v + 1)] += start[static_cast<std::size_t>(v)];
  std::vector<std::int64_t> order(static_cast<std::size_t>(start[static_cast<std::size_t>(V)]));
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t v = static_cast<std::int64_t>(ids[n]) - vocab_offset;
    if (v >= 0 && v < V) order[static_cast<std::size_t>(fill[static_cast<std::size_t>(v)]++)] = n;
  }
  std::vector<std::int64_t> touched;  // vocabulary rows with at least one token
  for (std::int64_t v = 0; v < V; ++v)
    if (start[static_cast<std::size_t>(v + 1)] > start[static_cast<std::size_t>(v)])
      touched.push_back(v);
  const auto rows = static_cast<std::int64_t>(touched.size());
  for_chunks(rows, rows_per_chunk(C), [&](std::int64_t b, std::int64_t e) {
    std::vector<double> acc(static_cast<std::size_t>(C));
    for (std::int64_t i = b; i < e; ++i) {
      const std::int64_t v = touched[static_cast<std::size_t>(i)];
      T* row = dtable + v * C;
      for (std::int64_t j = 0; j < C; ++j)
        acc[static_cast<std::size_t>(j)] = static_cast<double>(row[j]);
      for (std::int64_t s = start[static_cast<std::size_t>(v)];
           s < start[static_cast<std::size_t>(v + 1)]; ++s) {
        const T* d = dout + order[static_cast<std::size_t>(s)] * C;
        for (std::int64_t j = 0; j < C; ++j)
          acc[static_cast<std::size_t>(j)] += static_cast<double>(d[j]);
      }
      for (std::int64_t j = 0; j < C; ++j)
        row[j] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    }
  });
}

}  // namespace meshtrain::cpu
