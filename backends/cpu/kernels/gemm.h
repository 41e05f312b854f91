// Row-major GEMM through BLAS (sgemm for float, dgemm for double), with the
// fused bias of backends/backend.h, cut into tiles of C that run in parallel.
//
// BLAS runs single-threaded. OpenBLAS 0.3.21's sgemm gives different bits
// with 1 and 2 threads (104 of 128 shapes tried, RESULTS.md), and different
// bits for an element depending on the sizes of the call that computes it
// (a 64×64 product computed whole or as two 32×64 halves differs). So the
// tiles are a function of (m, n, k) alone, never of the thread count: each
// element of C is computed by the same call, of the same sizes, whichever
// thread runs it, and K is never split.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

inline void ensure_single_threaded_blas() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

inline void blas_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

inline void blas_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      double alpha, const double* a, std::int64_t lda, const double* b,
                      std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// How a GEMM's C (m, n) is cut: tiles of `rows` × `cols` (the last ones
// smaller), row-major over the tile grid. A pure function of the shape.
struct GemmTiles {
  std::int64_t rows, cols, grid_rows, grid_cols;
  std::int64_t count() const { return grid_rows * grid_cols; }
};

// Tiles of about equal size, at most 256 × 256, more of them (down to 64
// columns, then 32 rows) while there are fewer than 4 and each keeps >= 16
// MFLOP, and an even number of them where that splits again: so that two or
// four threads share them evenly. Rows are rounded up to multiples of 8 and
// columns to 16 (the kernels' unrolls). A product under 16 MFLOP (0.1-0.2
// ms on one core, a few thread wake-ups on the 2-core VM) is one tile.
// Measured on the step's GEMMs (GPT-2 small, B=4 T=64, one thread): 1.02-1.04x
// the time of whole calls with OpenBLAS's Haswell or Cooperlake kernels,
// where 128 × 256 tiles took 1.10-1.17x (RESULTS.md).
inline GemmTiles gemm_tiles(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr double kMinTileFlops = 16e6;
  constexpr std::int64_t kMaxSide = 256, kMinTiles = 4;
  auto flops = [k](std::int64_t rows, std::int64_t cols) {  // of one tile when cut so
    return 2.0 * static_cast<double>(k) * static_cast<double>(rows) * static_cast<double>(cols);
  };
  if (flops(m, n) < kMinTileFlops) return GemmTiles{m, n, 1, 1};
  std::int64_t gr = (m + kMaxSide - 1) / kMaxSide, gc = (n + kMaxSide - 1) / kMaxSide;
  auto more_cols = [&] { return n / (gc + 1) >= 64 && flops(m / gr, n / (gc + 1)) >= kMinTileFlops; };
  auto more_rows = [&] { return m / (gr + 1) >= 32 && flops(m / (gr + 1), n / gc) >= kMinTileFlops; };
  while (gr * gc < kMinTiles && more_cols()) ++gc;
  while (gr * gc < kMinTiles && more_rows()) ++gr;
  if (gr * gc > 1 && gr * gc % 2 == 1) {
    if (n / (gc + 1) >= 64) ++gc;
    else if (m / (gr + 1) >= 16) ++gr;
  }
  auto round_up = [](std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; };
  GemmTiles t{round_up((m + gr - 1) / gr, 8), round_up((n + gc - 1) / gc, 16), 0, 0};
  t.rows = std::min(t.rows, m), t.cols = std::min(t.cols, n);
  t.grid_rows = (m + t.rows - 1) / t.rows;
  t.grid_cols = (n + t.cols - 1) / t.cols;
  return t;
}

// c (m, n) = alpha · op(a) op(b) + beta · c [+ bias (n) on every row]; a is
// (m, k), or (k, m) when ta; b is (k, n), or (n, k) when tb; all contiguous.
// beta == 0 ignores the old contents of c (it may be uninitialised).
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c, const T* bias) {
  ensure_single_threaded_blas();
  if (m == 0 || n == 0) return;
  const GemmTiles tiles = gemm_tiles(m, n, k);
  // Rows [r0, r0 + rows) and columns [c0, c0 + cols) of c.
  auto tile = [&](std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols) {
    T* ct = c + r0 * n + c0;
    T tile_beta = beta;
    if (bias != nullptr) {
      for (std::int64_t i = 0; i < rows; ++i) {
        T* row = ct + i * n;
        for (std::int64_t j = 0; j < cols; ++j)
          row[j] = (beta == T(0) ? T(0) : beta * row[j]) + bias[c0 + j];
      }
      tile_beta = T(1);
    }
    if (k == 0) {
      if (bias == nullptr)
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = 0; j < cols; ++j) ct[i * n + j] = beta == T(0) ? T(0) : beta * ct[i * n + j];
      return;
    }
    const T* at = ta ? a + r0 : a + r0 * k;  // rows of op(a)
    const T* bt = tb ? b + c0 * k : b + c0;  // columns of op(b)
    blas_gemm(ta, tb, rows, cols, k, alpha, at, ta ? m : k, bt, tb ? k : n, tile_beta, ct, n);
  };
  for_chunks(tiles.count(), 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t r0 = (t / tiles.grid_cols) * tiles.rows, c0 = (t % tiles.grid_cols) * tiles.cols;
      tile(r0, std::min(tiles.rows, m - r0), c0, std::min(tiles.cols, n - c0));
    }
  });
}

}  // namespace meshtrain::cpu
