// LayerNorm and RMSNorm over the last dimension, forward and backward.
// Legend: N rows, C width. Row statistics accumulate in double; weight and
// bias gradients sum over rows in fixed chunks (see parallel.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/parallel.h"

namespace meshtrain::cpu {

// x (N, C), weight/bias (C) -> out (N, C), mean/rstd (N).
template <class T>
void layernorm_forward(std::int64_t N, std::int64_t C, const T* x, const T* weight, const T* bias,
                       T* out, T* mean, T* rstd, double eps) {
  for_rows(N, C, [&](std::int64_t r) {
    const T* xr = x + r * C;
    double s = 0.0;
    for (std::int64_t j = 0; j < C; ++j) s += static_cast<double>(xr[j]);
    const double mu = s / static_cast<double>(C);
    double v = 0.0;
    for (std::int64_t j = 0; j < C; ++j) {
      const double d = static_cast<double>(xr[j]) - mu;
      v += d * d;
    }
    const double rs = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
    T* o = out + r * C;
    for (std::int64_t j = 0; j < C; ++j)
      o[j] =
          static_cast<T>((static_cast<double>(xr[j]) - mu) * rs * static_cast<double>(weight[j]) +
                         static_cast<double>(bias[j]));
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
  });
}

// dx (N, C) overwritten; dweight, dbias (C) accumulate.
template <class T>
void layernorm_backward(std::int64_t N, std::int64_t C, const T* dout, const T* x, const T* weight,
                        const T* mean, const T* rstd, T* dx, T* dweight, T* dbias) {
  for_rows(N, C, [&](std::int64_t r) {
    const T* xr = x + r * C;
    const T* dr = dout + r * C;
    const double mu = static_cast<double>(mean[r]);
    const double rs = static_cast<double>(rstd[r]);
    double mean_g = 0.0, mean_gx = 0.0;  // means of dxhat and dxhat·xhat
    for (std::int64_t j = 0; j < C; ++j) {
      const double xhat = (static_cast<double>(xr[j]) - mu) * rs;
      const double g = static_cast<double>(dr[j]) * static_cast<double>(weight[j]);
      mean_g += g;
      mean_gx += g * xhat;
    }
    mean_g /= static_cast<double>(C);
    mean_gx /= static_cast<double>(C);
    T* o = dx + r * C;
    for (std::int64_t j = 0; j < C; ++j) {
      const double xhat = (static_cast<double>(xr[j]) - mu) * rs;
      const double g = static_cast<double>(dr[j]) * static_cast<double>(weight[j]);
      o[j] = static_cast<T>(rs * (g - mean_g - xhat * mean_gx));
    }
  });
  // acc = [dweight (C) | dbias (C)]
  std::vector<double> acc(static_cast<std::size_t>(2 * C), 0.0);
  reduce_rows(
      N, 2 * C,
      [&](std::int64_t r, double* a) {
        const T* xr = x + r * C;
        const T* dr = dout + r * C;
        const double mu = static_cast<double>(mean[r]);
        const double rs = static_cast<double>(rstd[r]);
        for (std::int64_t j = 0; j < C; ++j) {
          const double d = static_cast<double>(dr[j]);
          a[j] += d * (static_cast<double>(xr[j]) - mu) * rs;
          a[C + j] += d;
        }
      },
      acc.data());
  for (std::int64_t j = 0; j < C; ++j) {
    dweight[j] = static_cast<T>(static_cast<double>(dweight[j]) + acc[j]);
    dbias[j] = static_cast<T>(static_cast<double>(dbias[j]) + acc[C + j]);
  }
}

// x (N, C), weight (C) -> out (N, C) = x · rstd · weight, rstd (N).
template <class T>
void rmsnorm_forward(std::int64_t N, std::int64_t C, const T* x, const T* weight, T* out, T* rstd,
                     double eps) {
  for_rows(N, C, [&](std::int64_t r) {
    const T* xr = x + r * C;
    double ss = 0.0;
    for (std::int64_t j = 0; j < C; ++j)
      ss += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    T* o = out + r * C;
    for (std::int64_t j = 0; j < C; ++j)
      o[j] = static_cast<T>(static_cast<double>(xr[j]) * rs * static_cast<double>(weight[j]));
    rstd[r] = static_cast<T>(rs);
  });
}

// dx (N, C) overwritten; dweight (C) accumulates.
template <class T>
void rmsnorm_backward(std::int64_t N, std::int64_t C, const T* dout, const T* x, const T* weight,
                      const T* rstd, T* dx, T* dweight) {
  for_rows(N, C, [&](std::int64_t r) {
    const T* xr = x + r * C;
    const T* dr = dout + r * C;
    const double rs = static_cast<double>(rstd[r]);
    double mean_gx = 0.0;
    for (std::int64_t j = 0; j < C; ++j)
      mean_gx += static_cast<double>(dr[j]) * static_cast<double>(weight[j]) *
                 static_cast<double>(xr[j]) * rs;
    mean_gx /= static_cast<double>(C);
    T* o = dx + r * C;
    for (std::int64_t j = 0; j < C; ++j) {
      const double g = static_cast<double>(dr[j]) * static_cast<double>(weight[j]);
      o[j] = static_cast<T>(rs * (g - static_cast<double>(xr[j]) * rs * mean_gx));
    }
  });
  std::vector<double> acc(static_cast<std::size_t>(C), 0.0);
  reduce_rows(
      N, C,
      [&](std::int64_t r, double* a) {
        const T* xr = x + r * C;
        const T* dr = dout + r * C;
        const double rs = static_cast<double>(rstd[r]);
        for (std::int64_t j = 0; j < C; ++j)
          a[j] += static_cast<double>(dr[j]) * static_cast<double>(xr[j]) * rs;
      },
      acc.data());
  for (std::int64_t j = 0; j < C; ++j)
    dweight[j] = static_cast<T>(static_cast<double>(dweight[j]) + acc[j]);
}

}  // namespace meshtrain::cpu
