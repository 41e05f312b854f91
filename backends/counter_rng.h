// Counter-based random draws shared by the engine and every backend: a draw
// is a pure function of (key, counter), so any shard of a tensor, on any
// backend and in any order, draws what the whole tensor would at those
// positions, and nothing needs to be stored or replayed.
#pragma once

#include <cmath>
#include <cstdint>

// Under nvcc these functions are also device functions (CudaBackend::init_normal
// evaluates normal_at per element on the GPU); every other compiler sees plain
// inline functions, so this header needs no CUDA header.
#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace meshtrain {

// splitmix64's finaliser: a bijective 64-bit mix with full avalanche.
MT_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A standard normal draw for counter i of stream `key` (Box–Muller on two
// 53-bit uniforms; the cosine branch only, so each counter is independent),
// in double precision with the C library's log and cos. This is the
// reference: backends that draw faster must give the same fp32 values of
// stddev · normal_at (Backend::init_normal). The global log, cos and
// sqrt are the C library's on the host and CUDA's double-precision ones on the
// device (std:: names are host-only there).
MT_HOST_DEVICE inline double normal_at(std::uint64_t key, std::uint64_t i) {
  const std::uint64_t a = mix64(key ^ mix64(2 * i)), b = mix64(key ^ mix64(2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}

}  // namespace meshtrain
