// Helpers of the cpu backend tests: seeded data, moving vectors to and from
// the backend, and central finite differences on fp64 kernels.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string_view>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace meshtrain::testing {

using Vec = std::vector<double>;

// A fixed seed per test, printed so a failure can be replayed.
inline std::uint64_t seed_for(std::string_view test) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the test name
  for (char c : test) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::printf("seed %llu for %.*s\n", static_cast<unsigned long long>(h),
              static_cast<int>(test.size()), test.data());
  return h;
}

inline Vec random_vec(std::mt19937_64& rng, std::size_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline double norm(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// ||a - b|| / ||b|| (absolute when b is zero).
inline double rel_err(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  const double nb = norm(b);
  return std::sqrt(d) / (nb > 0 ? nb : 1.0);
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of the scalar loss() with respect to every element of x
// (perturbed in place and restored).
inline Vec numeric_grad(Vec& x, const std::function<double()>& loss, double h = 1e-5) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = loss();
    x[i] = x0 - h;
    const double down = loss();
    x[i] = x0;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline Tensor upload(Backend& b, const Shape& s, const Vec& v) {
  REQUIRE(static_cast<std::int64_t>(v.size()) == s.numel());
  Tensor t = b.empty(s);
  std::vector<float> f(v.begin(), v.end());
  b.write(t, f);
  return t;
}

inline Tensor upload_ids(Backend& b, const std::vector<std::int32_t>& ids) {
  Tensor t = b.empty({static_cast<std::int64_t>(ids.size())}, DType::i32);
  b.write(t, ids);
  return t;
}

inline Vec download(Backend& b, const Tensor& t) {
  std::vector<float> f(static_cast<std::size_t>(t.numel()));
  REQUIRE(b.read(t, f).ok());
  return Vec(f.begin(), f.end());
}

inline std::vector<float> download_f32(Backend& b, const Tensor& t) {
  std::vector<float> f(static_cast<std::size_t>(t.numel()));
  REQUIRE(b.read(t, f).ok());
  return f;
}

// A backend's attention_forward and attention_backward of op over qkv
// (B, T, H + 2G, D) and dout (B, T, H, D): out, lse (B, H, T) and dqkv.
// poison_dqkv fills dqkv with NaN first, so that backward must write every
// element.
struct BackendAttention {
  Vec out, lse, dqkv;
};
inline BackendAttention backend_attention(Backend& be, const AttentionOp& op, std::int64_t B, std::int64_t T,
                                          const Vec& qkv, const Vec& dout, bool poison_dqkv = false) {
  const std::int64_t H = op.heads, G = op.kv_heads, D = op.head_dim;
  Tensor tq = upload(be, {B, T, H + 2 * G, D}, qkv);
  Tensor to = be.empty({B, T, H, D}), tl = be.empty({B, H, T});
  be.attention_forward(tq, to, tl, op);
  Tensor tdq = be.empty(tq.shape());
  if (poison_dqkv) be.fill(tdq, std::nanf(""));
  be.attention_backward(upload(be, to.shape(), dout), tq, to, tl, tdq, op);
  return {download(be, to), download(be, tl), download(be, tdq)};
}

// Tolerances: fp64 kernels against finite differences, and the fp32 backend
// against the fp64 kernels.
inline constexpr double kFdTol = 1e-6;
inline constexpr double kF32Tol = 1e-3;

}  // namespace meshtrain::testing
