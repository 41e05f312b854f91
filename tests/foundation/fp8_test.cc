// FP8 emulation (core/fp8.h) against values and encodings worked out by hand
// from the formats' definitions: E4M3 (bias 7, 3 mantissa bits, max 448),
// E5M2 (bias 15, 2 mantissa bits, max 57344).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "core/fp8.h"

using namespace meshtrain;

TEST_CASE("fp8: 0.1 rounds to its nearest E4M3 and E5M2 neighbours", "[fp8]") {
  // 0.1 = 1.6·2^-4. E4M3 keeps 3 mantissa bits: 1.5 or 1.625 -> 1.625·2^-4 = 0.1015625,
  // exponent field -4 + 7 = 3, mantissa 101: 0 0011 101 = 0x1D.
  CHECK(round_to_fp8(0.1f, Fp8Format::e4m3) == 0.1015625f);
  CHECK(fp8_bits(0.1f, Fp8Format::e4m3) == 0x1D);
  // E5M2 keeps 2: 1.5 or 1.75 -> 1.5·2^-4 = 0.09375, exponent field -4 + 15 = 11, mantissa 10:
  // 0 01011 10 = 0x2E.
  CHECK(round_to_fp8(0.1f, Fp8Format::e5m2) == 0.09375f);
  CHECK(fp8_bits(0.1f, Fp8Format::e5m2) == 0x2E);
  CHECK(round_to_fp8(-0.1f, Fp8Format::e4m3) == -0.1015625f);
  CHECK(fp8_bits(-0.1f, Fp8Format::e4m3) == 0x9D);
}

TEST_CASE("fp8: ties round to the even mantissa", "[fp8]") {
  // 1.0625 is halfway between 1.0 (mantissa 000) and 1.125 (001): to 1.0.
  CHECK(round_to_fp8(1.0625f, Fp8Format::e4m3) == 1.0f);
  // 1.1875 is halfway between 1.125 (001) and 1.25 (010): to 1.25.
  CHECK(round_to_fp8(1.1875f, Fp8Format::e4m3) == 1.25f);
  // Just above a tie goes up.
  CHECK(round_to_fp8(std::nextafter(1.0625f, 2.f), Fp8Format::e4m3) == 1.125f);
  // E5M2: 1.125 is halfway between 1.0 (00) and 1.25 (01): to 1.0; 1.375 between 1.25 and 1.5: to 1.5.
  CHECK(round_to_fp8(1.125f, Fp8Format::e5m2) == 1.0f);
  CHECK(round_to_fp8(1.375f, Fp8Format::e5m2) == 1.5f);
}

TEST_CASE("fp8: saturates at the largest finite value", "[fp8]") {
  CHECK(fp8_max(Fp8Format::e4m3) == 448.f);  // 1.75·2^8
  CHECK(fp8_max(Fp8Format::e5m2) == 57344.f);  // 1.75·2^15
  CHECK(round_to_fp8(500.f, Fp8Format::e4m3) == 448.f);
  CHECK(round_to_fp8(-1e30f, Fp8Format::e4m3) == -448.f);
  CHECK(round_to_fp8(std::numeric_limits<float>::infinity(), Fp8Format::e4m3) == 448.f);
  CHECK(fp8_bits(1e6f, Fp8Format::e4m3) == 0x7E);  // 0 1111 110: 1.110b·2^8 (1111 111 is NaN)
  CHECK(round_to_fp8(60000.f, Fp8Format::e5m2) == 57344.f);
  CHECK(fp8_bits(60000.f, Fp8Format::e5m2) == 0x7B);  // 0 11110 11 (11111 is inf/NaN)
  // Below the maximum, the spacing at the top exponent: E4M3 416 = 1.625·2^8, 432 is its tie with 448.
  CHECK(round_to_fp8(420.f, Fp8Format::e4m3) == 416.f);
  CHECK(round_to_fp8(440.f, Fp8Format::e4m3) == 448.f);
}

TEST_CASE("fp8: subnormals, zero and NaN", "[fp8]") {
  // E4M3's smallest subnormal is 2^(1-7-3) = 2^-9: encoding 0x01.
  CHECK(round_to_fp8(std::ldexp(1.f, -9), Fp8Format::e4m3) == std::ldexp(1.f, -9));
  CHECK(fp8_bits(std::ldexp(1.f, -9), Fp8Format::e4m3) == 0x01);
  // 2^-10 is the tie between 0 and 2^-9: to 0 (even); 3·2^-11 = 0.75·2^-9 rounds up to 2^-9.
  CHECK(round_to_fp8(std::ldexp(1.f, -10), Fp8Format::e4m3) == 0.f);
  CHECK(round_to_fp8(3 * std::ldexp(1.f, -11), Fp8Format::e4m3) == std::ldexp(1.f, -9));
  // 7·2^-9 is the largest subnormal (0 0000 111), 2^-6 the smallest normal (0 0001 000).
  CHECK(fp8_bits(7 * std::ldexp(1.f, -9), Fp8Format::e4m3) == 0x07);
  CHECK(fp8_bits(std::ldexp(1.f, -6), Fp8Format::e4m3) == 0x08);
  // E5M2's smallest subnormal: 2^(1-15-2) = 2^-16.
  CHECK(fp8_bits(std::ldexp(1.f, -16), Fp8Format::e5m2) == 0x01);
  CHECK(round_to_fp8(0.f, Fp8Format::e4m3) == 0.f);
  CHECK(std::isnan(round_to_fp8(std::nanf(""), Fp8Format::e4m3)));
  CHECK(fp8_bits(std::nanf(""), Fp8Format::e4m3) == 0x7F);
  CHECK(std::isnan(fp8_value(0x7F, Fp8Format::e4m3)));
  CHECK(std::isinf(fp8_value(0x7C, Fp8Format::e5m2)));  // 0 11111 00
}

TEST_CASE("fp8: every encoding decodes and rounds back to itself", "[fp8]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int b = 0; b < 256; ++b) {
      const float v = fp8_value(static_cast<std::uint8_t>(b), f);
      if (!std::isfinite(v)) continue;
      INFO("format " << static_cast<int>(f) << " bits " << b << " value " << v);
      CHECK(round_to_fp8(v, f) == v);
      if (v != 0) CHECK(fp8_bits(v, f) == b);  // -0 and +0 both exist; 0x80 decodes to -0
    }
}

TEST_CASE("fp8: quantize scales, rounds and scales back", "[fp8]") {
  // scale 4: 0.1·4 = 0.4 = 1.6·2^-2 -> 1.625·2^-2 = 0.40625, back: 0.1015625.
  // 200·4 = 800 saturates at 448, back: 112.
  const std::vector<float> x = {0.1f, 200.f, -0.03f};
  std::vector<float> out(3);
  fp8_quantize(x, 4.f, Fp8Format::e4m3, out);
  CHECK(out[0] == 0.1015625f);
  CHECK(out[1] == 112.f);
  // -0.12 = -1.92·2^-4 -> -1.875·2^-4 = -0.1171875, back: -0.029296875.
  CHECK(out[2] == -0.029296875f);
  CHECK(amax(x) == 200.f);
  CHECK(amax(std::vector<float>{}) == 0.f);
  CHECK(std::isnan(amax(std::vector<float>{1.f, std::nanf("")})));
}

TEST_CASE("fp8: delayed scaling uses the previous steps' amax", "[fp8]") {
  auto s = DelayedScaling::make(Fp8Format::e4m3, 2);
  REQUIRE(s.ok());
  CHECK(s->scale() == 1.f);  // nothing recorded yet
  s->record(2.f);
  CHECK(s->scale() == 224.f);  // 448 / 2
  s->record(0.5f);
  CHECK(s->scale() == 224.f);  // the larger of the two-step history still rules
  s->record(0.5f);
  CHECK(s->scale() == 896.f);  // 2 has left the history: 448 / 0.5
  s->record(0.f);
  CHECK(s->scale() == 896.f);  // max(0.5, 0)
  s->record(std::numeric_limits<float>::infinity());
  CHECK(s->scale() == 896.f);  // a bad step's amax counts as none; history (0, none): the scale stays
  auto margin = DelayedScaling::make(Fp8Format::e5m2, 1, 1);
  REQUIRE(margin.ok());
  margin->record(7.f);
  CHECK(margin->scale() == 57344.f / 7 / 2);
  auto bad = DelayedScaling::make(Fp8Format::e4m3, 0);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("history") && Catch::Contains("1 to"));
  CHECK_FALSE(DelayedScaling::make(Fp8Format::e4m3, 4, -1).ok());
}
