// Row-major GEMM through BLAS (sgemm for float, dgemm for double), with the
// fused bias of backends/backend.h. BLAS runs single-threaded: ranks as
// threads and TBB tasks supply the parallelism, and OpenBLAS's own pool would
// oversubscribe the cores.
#pragma once

#include <cblas.h>

#include <cstdint>

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

// c (m, n) = alpha · op(a) op(b) + beta · c [+ bias (n) on every row]; a is
// (m, k), or (k, m) when ta; b is (k, n), or (n, k) when tb; all contiguous.
// beta == 0 ignores the old contents of c (it may be uninitialised).
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c, const T* bias) {
  ensure_single_threaded_blas();
  if (m == 0 || n == 0) return;
  if (bias != nullptr) {
    for (std::int64_t i = 0; i < m; ++i) {
      T* row = c + i * n;
      for (std::int64_t j = 0; j < n; ++j) row[j] = (beta == T(0) ? T(0) : beta * row[j]) + bias[j];
    }
    beta = T(1);
  }
  if (k == 0) {
    if (bias == nullptr)
      for (std::int64_t i = 0; i < m * n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
    return;
  }
  blas_gemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

}  // namespace meshtrain::cpu
