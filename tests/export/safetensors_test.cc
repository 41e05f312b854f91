// The safetensors format (engine/export/safetensors.h): bytes as the spec
// lays them out, dtype conversions, and damaged files refused by name.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/export/safetensors.h"

using namespace meshtrain;

namespace {

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// A file from its header and data, as a hand-written writer would make it.
std::string file_of(const nlohmann::json& header, const std::string& data) {
  const std::string h = header.dump();
  return le64(h.size()) + h + data;
}

std::string floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 4);
}

std::string error_of(const std::string& file) {
  auto r = decode_safetensors(file, "x.safetensors");
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

}  // namespace

TEST_CASE("a file has the spec's layout: length, JSON header padded to 8, data back to back", "[export]") {
  const std::vector<SafeTensor> tensors = {{"b", SafeDType::f32, {2}, floats({1.f, 2.f})},
                                           {"a", SafeDType::bf16, {1, 1}, std::string("\x80\x3f", 2)}};
  auto bytes = encode_safetensors(tensors, {{"format", "pt"}});
  REQUIRE(bytes.ok());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes->size() == 8 + n + 10);
  const auto header = nlohmann::json::parse(bytes->substr(8, n));
  CHECK(header["__metadata__"] == nlohmann::json{{"format", "pt"}});
  CHECK(header["b"] == nlohmann::json{{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}});
  CHECK(header["a"] == nlohmann::json{{"dtype", "BF16"}, {"shape", {1, 1}}, {"data_offsets", {8, 10}}});
  CHECK(bytes->substr(8 + n, 8) == floats({1.f, 2.f}));

  auto back = decode_safetensors(*bytes, "x");
  REQUIRE(back.ok());
  CHECK(back->metadata.at("format") == "pt");
  REQUIRE(back->tensors.size() == 2);
  CHECK(back->tensors[0].name == "b");  // in the order of their data
  CHECK(to_float32(back->tensors[1]) == std::vector<float>{1.f});
  auto again = encode_safetensors(back->tensors, back->metadata);
  REQUIRE(again.ok());
  CHECK(*again == *bytes);
}

TEST_CASE("bf16 and f16 round to nearest even and read back exactly", "[export]") {
  // 1 + 2^-8 lies halfway between two bf16 values: to the even one, 1.0; 1 + 3·2^-8 rounds up to 1 + 2^-6.
  const std::vector<float> v = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, -2.5f, 65504.f, 70000.f, 0x1p-24f, 0x1p-25f, 0.f};
  const std::vector<float> bf = to_float32({"t", SafeDType::bf16, {8}, from_float32(v, SafeDType::bf16)});
  CHECK(bf[0] == 1.f);
  CHECK(bf[1] == 1.f + 0x1p-6f);
  CHECK(bf[2] == -2.5f);
  const std::vector<float> h = to_float32({"t", SafeDType::f16, {8}, from_float32(v, SafeDType::f16)});
  CHECK(h[0] == 1.f + 0x1p-8f);  // f16 keeps 10 bits: 1 + 2^-8 is exact
  CHECK(h[1] == 1.f + 3 * 0x1p-8f);
  CHECK(h[3] == 65504.f);
  CHECK(std::isinf(h[4]));
  CHECK(h[5] == 0x1p-24f);  // the smallest subnormal
  CHECK(h[6] == 0.f);       // half of it: to even, zero
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(to_float32({"t", SafeDType::bf16, {1}, from_float32({nan}, SafeDType::bf16)})[0]));
}

TEST_CASE("damaged files are refused naming the tensor and the field", "[export]") {
  const nlohmann::json good = {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}};
  const std::string data = floats({1, 2, 3, 4});
  REQUIRE(decode_safetensors(file_of(good, data), "x").ok());

  SECTION("truncated data") {
    const std::string msg = error_of(file_of(good, data.substr(0, 12)));
    CHECK_THAT(msg, Catch::Contains("tensor 'w'") && Catch::Contains("truncated"));
  }
  SECTION("a header length past the end of the file") {
    std::string f = file_of(good, data);
    const std::string msg = error_of(le64(1u << 30) + f.substr(8));
    CHECK_THAT(msg, Catch::Contains("header length 1073741824 runs past the end of the file"));
    CHECK_THAT(error_of("abc"), Catch::Contains("too short"));
  }
  SECTION("a header that is not JSON") {
    CHECK_THAT(error_of(le64(4) + "{no}"), Catch::Contains("not a JSON object"));
  }
  SECTION("overlapping offsets") {
    nlohmann::json h = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                        {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
    CHECK_THAT(error_of(file_of(h, floats({1, 2, 3}))), Catch::Contains("tensors 'a' and 'b' overlap"));
  }
  SECTION("a hole or trailing bytes") {
    nlohmann::json h = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
    CHECK_THAT(error_of(file_of(h, floats({1, 2}))), Catch::Contains("bytes [0, 4) of the data belong to no tensor"));
    CHECK_THAT(error_of(file_of(good, data + "zz")), Catch::Contains("last 2 bytes"));
  }
  SECTION("an unknown dtype") {
    nlohmann::json h = good;
    h["w"]["dtype"] = "I64";
    h["w"]["shape"] = {2};
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("tensor 'w' has dtype I64"));
  }
  SECTION("a shape that does not fit its offsets") {
    nlohmann::json h = good;
    h["w"]["shape"] = {2, 3};
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("tensor 'w': shape [2,3] of F32 is 24 bytes"));
  }
  SECTION("malformed fields") {
    nlohmann::json h = good;
    h["w"]["shape"] = {-2, 2};
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("tensor 'w': \"shape\" holds -2"));
    h = good;
    h["w"].erase("data_offsets");
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("tensor 'w' needs"));
    h = good;
    h["w"]["data_offsets"] = {16, 0};
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("ends before it begins"));
    h = good;
    h["__metadata__"] = {{"step", 3}};
    CHECK_THAT(error_of(file_of(h, data)), Catch::Contains("\"__metadata__\" entry \"step\""));
  }
}
