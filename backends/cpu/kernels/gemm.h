// Row-major GEMM through BLAS (sgemm for float, dgemm for double), with the
// fused bias of backends/backend.h, cut into tiles of C that run in parallel.
//
// BLAS runs single-threaded. OpenBLAS 0.3.21's sgemm gives different bits
// with 1 and 2 threads (104 of 128 shapes tried, RESULTS.md), and different
// bits for an element depending on the sizes of the call that computes it
// (a 64×64 product computed whole or as two 32×64 halves differs). So the
// tiles are a function of (m, n, k) alone, never of the thread count: each
// element of C is computed by the same call, of the same sizes, whichever
// thread runs it, and K is never split. Tile bounds are multiples of 32
// rows and 64 columns, OpenBLAS's kernel unrolls on this machine (Haswell).
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

// Tiles of 128 × 256, made narrower, then shorter (down to 64 columns and 32
// rows), while there are fewer than 8 and each keeps >= 4 MFLOP; a product
// under 4 MFLOP is one tile (one BLAS call, as a single thread would make).
inline GemmTiles gemm_tiles(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr double kMinTileFlops = 4e6;
  constexpr std::int64_t kMinTiles = 8;
  auto flops = [k](std::int64_t r, std::int64_t c) { return 2.0 * static_cast<double>(r * c * k); };
  GemmTiles t{m, n, 1, 1};
  if (flops(m, n) >= kMinTileFlops) {
    t.rows = std::min<std::int64_t>(m, 128);
    t.cols = std::min<std::int64_t>(n, 256);
    auto grid = [&] { return ((m + t.rows - 1) / t.rows) * ((n + t.cols - 1) / t.cols); };
    while (grid() < kMinTiles && t.cols > 64 && flops(t.rows, t.cols / 2) >= kMinTileFlops) t.cols /= 2;
    while (grid() < kMinTiles && t.rows > 32 && flops(t.rows / 2, t.cols) >= kMinTileFlops) t.rows /= 2;
  }
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
