#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace {
struct Run {
  int status;
  std::string out;
};
Run run(const std::string& args) {
  std::string cmd = std::string(MESHTRAIN_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  int status = pclose(f);
  return {WEXITSTATUS(status), out};
}
}  // namespace

TEST_CASE("meshtrain info --json reports parameters and a rank's groups", "[cli]") {
  Run r = run("info --model gpt2-124m --tp 2 --pp 4 --dp 2 --rank 5 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["parameters"].get<long long>() == 124439808);
  CHECK(j["groups"]["tensor"] == nlohmann::json({4, 5}));
  CHECK(j["groups"]["pipeline"] == nlohmann::json({1, 5, 9, 13}));
  CHECK(j["groups"]["data"] == nlohmann::json({5, 7}));
  CHECK(j["groups"]["embedding"].is_null());
  CHECK(j["plan"]["world_size"] == 16);
  CHECK(j["memory"]["total_bytes"].get<double>() > 0);
}

TEST_CASE("meshtrain info rejects bad input with the validation message", "[cli]") {
  Run r = run("info --model tiny --tp 3");
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("heads 4 are not divisible by tp 3"));
  Run typo = run("info --model tiny --schedule 1f1c");
  CHECK(typo.status != 0);
  CHECK_THAT(typo.out, Catch::Contains("did you mean '1f1b'"));
  Run rank = run("info --model tiny --rank 4");
  CHECK(rank.status != 0);
  CHECK_THAT(rank.out, Catch::Contains("--rank 4 is outside the world of 1 ranks"));
  Run not_a_number = run("info --tp two");
  CHECK(not_a_number.status != 0);
}
