// The cpu backend's 1-bit sign compression (Backend::sign_compress and
// sign_decompress) against a naive reference with the same float operations:
// the scale is the chunk's mean |y|, every sign is kept, the error is exactly
// y − scale·sign(y), and the packet layout is the documented one.
#include <bit>
#include <cstring>

#include "tests/cpu/cpu_test_util.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

struct Naive {
  std::vector<float> scale, decompressed, error;
};

// C chunks of k: y = x + e in float, scale = Σ|y| (double, in order) / k, ±scale by sign(y) (+ for y >= 0).
Naive naive_compress(const std::vector<float>& x, const std::vector<float>& e, std::int64_t C, std::int64_t k) {
  Naive n;
  n.decompressed.resize(x.size()), n.error.resize(x.size());
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (std::int64_t i = 0; i < k; ++i) sum += std::fabs(static_cast<double>(x[c * k + i] + e[c * k + i]));
    const float s = static_cast<float>(sum / static_cast<double>(k));
    n.scale.push_back(s);
    for (std::int64_t i = 0; i < k; ++i) {
      const float y = x[c * k + i] + e[c * k + i];
      n.decompressed[c * k + i] = y >= 0.f ? s : -s;
      n.error[c * k + i] = y - n.decompressed[c * k + i];
    }
  }
  return n;
}

}  // namespace

TEST_CASE("sign_compress keeps every sign and one mean-|y| scale per chunk, and the exact error",
          "[cpu][compression]") {
  std::mt19937_64 rng(seed_for("sign_compress"));
  CpuBackend b;
  // k = 45: a partial second sign word; k = 20: one word small enough to read back exactly as a float.
  for (std::int64_t k : {45, 20, 1000}) {
    const std::int64_t C = 3, W = (k + 31) / 32;
    INFO("k " << k);
    const Vec xv = random_vec(rng, static_cast<std::size_t>(C * k)), ev = random_vec(rng, static_cast<std::size_t>(C * k), 0.1);
    Tensor x = upload(b, {C, k}, xv), error = upload(b, {C, k}, ev);
    Tensor packets = b.empty({C, 1 + W}, DType::i32);
    b.sign_compress(x, error, packets);
    Tensor out = b.empty({C, k});
    b.sign_decompress(packets, out);
    const Naive want = naive_compress(std::vector<float>(xv.begin(), xv.end()), std::vector<float>(ev.begin(), ev.end()), C, k);
    CHECK(download_f32(b, out) == want.decompressed);
    CHECK(download_f32(b, error) == want.error);
    // Packets: word 0 the scale's bits, then sign bits of elements 32j + i, unused bits 0.
    const std::vector<float> words = download_f32(b, packets);  // i32 read back as float values
    for (std::int64_t c = 0; c < C; ++c) {
      CHECK(words[c * (1 + W)] == static_cast<float>(std::bit_cast<std::int32_t>(want.scale[c])));
      if (k == 20) {
        std::uint32_t bits = 0;
        for (std::int64_t i = 0; i < k; ++i) bits |= (want.decompressed[c * k + i] > 0 ? 1u : 0u) << i;
        CHECK(words[c * (1 + W) + 1] == static_cast<float>(bits));
      }
    }
    // Without error feedback: the same signs and scales of x alone, and no error to update.
    Tensor none;
    b.sign_compress(x, none, packets);
    b.sign_decompress(packets, out);
    const Naive plain = naive_compress(std::vector<float>(xv.begin(), xv.end()), std::vector<float>(C * k, 0.f), C, k);
    CHECK(download_f32(b, out) == plain.decompressed);
  }
}

TEST_CASE("sign compression with error feedback transmits the running sum of its inputs", "[cpu][compression]") {
  // Σ decompressed = Σ x − e_final: what error feedback promises (Karimireddy et al. 2019).
  std::mt19937_64 rng(seed_for("error feedback telescopes"));
  CpuBackend b;
  const std::int64_t k = 64;
  Tensor error = b.zeros({1, k}), packets = b.empty({1, 3}, DType::i32), out = b.empty({1, k});
  Vec sent(k, 0.0), given(k, 0.0);
  for (int step = 0; step < 50; ++step) {
    const Vec xv = random_vec(rng, k, 1.0 + step % 3);
    Tensor x = upload(b, {1, k}, xv);
    b.sign_compress(x, error, packets);
    b.sign_decompress(packets, out);
    const Vec d = download(b, out);
    for (std::int64_t i = 0; i < k; ++i) sent[i] += d[i], given[i] += xv[i];
  }
  const Vec e = download(b, error);
  for (std::int64_t i = 0; i < k; ++i) CHECK(sent[i] == Approx(given[i] - e[i]).margin(1e-4));
  // The error stays bounded (it does not grow with the steps).
  CHECK(norm(e) < 3.0 * std::sqrt(static_cast<double>(k)) * 3.0);
}
