// Does OpenBLAS's sgemm give the same bits (a) with 1 and with N threads,
// (b) when C is computed whole or as tiles (separate calls on blocks of
// rows and columns, K whole), (c) for inputs at other alignments? The cpu
// backend's GEMM (backends/cpu/kernels/gemm.h) is designed from the answers.
//
//   bench_blas_determinism [threads]      default 2
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

std::uint64_t state = 88172645463325252ULL;
float next() {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return static_cast<float>((state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

// C rows [r0, r1) x columns [c0, c1) of C = op(A) op(B) + beta C, row-major.
void block(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float beta, float* c,
           int r0, int r1, int c0, int c1) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, r1 - r0, c1 - c0, k,
              1.0f, ta ? a + r0 : a + static_cast<long>(r0) * k, ta ? m : k,
              tb ? b + static_cast<long>(c0) * k : b + c0, tb ? k : n, beta, c + static_cast<long>(r0) * n + c0, n);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int shapes[][3] = {{256, 2304, 768}, {256, 768, 768}, {256, 3072, 768}, {256, 768, 3072},
                           {256, 256, 768},  {768, 2304, 256}, {3072, 768, 256}, {2048, 2304, 768},
                           {100, 77, 333},   {37, 1000, 64},   {512, 512, 512},  {64, 64, 64},
                           {8, 8, 8},        {1, 768, 768},    {1024, 1024, 1024}, {2048, 768, 3072}};
  const int tiles[][2] = {{64, 64}, {128, 256}, {32, 512}, {96, 160}, {17, 33}};
  int cases = 0, by_threads = 0, by_tiles = 0, by_alignment = 0;
  for (const auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f}) {
          const int m = s[0], n = s[1], k = s[2];
          std::vector<float> a(static_cast<std::size_t>(m) * k + 16), b(static_cast<std::size_t>(k) * n + 16),
              c0(static_cast<std::size_t>(m) * n);
          for (auto& x : a) x = next();
          for (auto& x : b) x = next();
          for (auto& x : c0) x = next();
          std::vector<float> whole = c0, other = c0;
          openblas_set_num_threads(1);
          block(ta, tb, m, n, k, a.data(), b.data(), beta, whole.data(), 0, m, 0, n);
          openblas_set_num_threads(threads);
          block(ta, tb, m, n, k, a.data(), b.data(), beta, other.data(), 0, m, 0, n);
          openblas_set_num_threads(1);
          ++cases;
          const std::size_t bytes = whole.size() * sizeof(float);
          by_threads += std::memcmp(whole.data(), other.data(), bytes) != 0;
          bool tiled_differs = false;
          for (const auto& t : tiles) {
            other = c0;
            for (int r = 0; r < m; r += t[0])
              for (int c = 0; c < n; c += t[1])
                block(ta, tb, m, n, k, a.data(), b.data(), beta, other.data(), r, std::min(m, r + t[0]), c,
                      std::min(n, c + t[1]));
            tiled_differs = tiled_differs || std::memcmp(whole.data(), other.data(), bytes) != 0;
          }
          by_tiles += tiled_differs;
          // The same call with A and B moved by 3 and 5 floats.
          std::vector<float> a2(a.size()), b2(b.size());
          std::memcpy(a2.data() + 3, a.data(), (a.size() - 16) * sizeof(float));
          std::memcpy(b2.data() + 5, b.data(), (b.size() - 16) * sizeof(float));
          other = c0;
          block(ta, tb, m, n, k, a2.data() + 3, b2.data() + 5, beta, other.data(), 0, m, 0, n);
          by_alignment += std::memcmp(whole.data(), other.data(), bytes) != 0;
        }
  std::printf("%s\n", openblas_get_config());
  std::printf("%d cases (shapes x transposes x beta): %d differ between 1 and %d threads, %d between whole and "
              "tiled, %d between alignments\n",
              cases, by_threads, threads, by_tiles, by_alignment);
  return 0;
}
