// core/: the one path of user input. Numbers out of range, files that are not
// files, JSON nested too deep or holding numbers no double holds: each is an
// Error naming the field or file and what would be valid.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/bounded.h"
#include "core/host_memory.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "tests/training/temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return testing::scratch_path("input-test", name); }

template <class T>
std::string error_of(const Result<T>& r) {
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

}  // namespace

TEST_CASE("flag numbers: integers are digits, reals are finite, both within range", "[reliability][input]") {
  CHECK(parse_int("--tp", "8", {1, 64}).value() == 8);
  CHECK(parse_int("--tp", "+8", {1, 64}).value() == 8);
  CHECK_THAT(error_of(parse_int("--tp", "0", {1, 64})), Catch::Contains("--tp must be an integer in [1, 64], got 0"));
  for (const char* bad : {"1e8", "2.0", "0x10", "", " 1", "1 ", "4294967297", "99999999999999999999"})
    CHECK_THAT(error_of(parse_int("--tp", bad, {1, 1 << 20})), Catch::Contains("--tp must be an integer in [1, 1048576]"));
  CHECK(parse_uint64("--seed", "18446744073709551615", ~std::uint64_t{0}).value() == ~std::uint64_t{0});
  for (const char* bad : {"1e23", "18446744073709551616"})
    CHECK_THAT(error_of(parse_uint64("--seed", bad, ~std::uint64_t{0})), Catch::Contains("--seed must be an integer"));
  // A negative number is its own mistake (a sign, not a magnitude): it says so.
  CHECK_THAT(error_of(parse_uint64("--seed", "-1", ~std::uint64_t{0})), Catch::Contains("--seed is negative (-1)"));
  CHECK_THAT(error_of(parse_int("--tp", "-3", {1, 64})), Catch::Contains("--tp is negative (-3); it must be an integer in [1, 64]"));
  CHECK_THAT(error_of(parse_int("--rank", "-3", {0, 64})), Catch::Contains("--rank is negative (-3); it must be an integer in [0, 64]"));
  CHECK_THAT(error_of(parse_real("--lr", "-0.5", {0, 1e9, true})), Catch::Contains("--lr is negative (-0.5)"));
  CHECK(parse_real("--lr", "3e-4", {0, 1e9, true}).value() == Approx(3e-4));
  for (const char* bad : {"inf", "nan", "-inf", "1e400", "0", "abc", ""})
    CHECK_THAT(error_of(parse_real("--lr", bad, {0, 1e9, true})), Catch::Contains("--lr must be a finite number in (0, 1000000000]"));
  CHECK_THAT(error_of(parse_real("--dropout", "1", {0, 1, false, true})), Catch::Contains("in [0, 1)"));
}

TEST_CASE("JSON: depth and number overflow are errors, not crashes", "[reliability][input]") {
  const std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK_THAT(error_of(parse_json(deep, "model file 'm.json'")),
             Catch::Contains("model file 'm.json' nests deeper than 64 levels"));
  // Brackets inside strings are text, not nesting.
  CHECK(parse_json("{\"a\": \"" + std::string(1000, '[') + "\"}", "x").ok());
  CHECK_THAT(error_of(parse_json("{\"a\": 1e400}", "plan file 'p.json'")),
             Catch::Contains("plan file 'p.json' is not valid JSON: number overflow"));
  CHECK_THAT(error_of(parse_json("{\"a\": 1,}", "x")), Catch::Contains("x is not valid JSON: parse error at line 1, column 9: syntax error"));
  CHECK_THAT(error_of(parse_json(std::string("\x01\xff{", 3), "x")), Catch::Contains("x is not valid JSON"));
}

TEST_CASE("JSON fields: types and ranges are checked, naming field and range", "[reliability][input]") {
  const nlohmann::json j = nlohmann::json::parse(
      R"({"tp": 4294967297, "neg": -2, "big": 18446744073709551615, "f": 2.5, "s": "x", "b": true, "eps": 1e-300})");
  const JsonFields f = JsonFields::of(j, "plan field", "").value();
  int tp = 1;
  CHECK_THAT(f.get_int("tp", IntRange{1, 1 << 20}, tp).error().message(),
             Catch::Contains("plan field 'tp' must be an integer in [1, 1048576], got 4294967297"));
  CHECK(tp == 1);  // unchanged
  std::int64_t big = 0;
  CHECK_THAT(f.get_int("big", IntRange{0, 10}, big).error().message(), Catch::Contains("got 18446744073709551615"));
  int as_int = 0;
  CHECK_THAT(f.get_int("f", IntRange{0, 10}, as_int).error().message(), Catch::Contains("must be an integer"));
  CHECK_THAT(f.get_int("s", IntRange{0, 10}, as_int).error().message(), Catch::Contains("got \"x\""));
  unsigned u = 0;
  CHECK_THAT(f.get_int("neg", IntRange{-5, 5}, u).error().message(), Catch::Contains("in [0, 5]"));
  double eps = 1;
  CHECK_THAT(f.get_real("eps", RealRange{1e-12, 1}, eps).error().message(),
             Catch::Contains("plan field 'eps' must be a number in [1e-12, 1], got 1e-300"));
  std::optional<int> absent;
  CHECK(f.get_int("nope", IntRange{0, 1}, absent).ok());
  CHECK_FALSE(absent.has_value());
  CHECK_THAT(f.check_known({"tp", "neg", "big", "f", "s", "b"}).error().message(),
             Catch::Contains("unknown plan field 'eps'"));
  CHECK_THAT(error_of(JsonFields::of(nlohmann::json::array(), "x", "a plan must be a JSON object")),
             Catch::Contains("a plan must be a JSON object, got []"));
}

TEST_CASE("input files: only regular files, bounded, never blocking", "[reliability][input]") {
  const fs::path dir = scratch("a-directory.json");
  fs::create_directories(dir);
  CHECK_THAT(error_of(read_input_file(dir.string(), "model file")),
             Catch::Contains("model file '" + dir.string() + "' is a directory"));
  const fs::path fifo = scratch("a-fifo.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THAT(error_of(read_input_file(fifo.string(), "plan file")),  // would block forever if opened
             Catch::Contains("is a FIFO (named pipe), not a regular file"));
  CHECK_THAT(error_of(read_input_file("/dev/zero", "cluster file")),  // would never end
             Catch::Contains("'/dev/zero' is a character device"));
  CHECK_THAT(error_of(read_input_file(scratch("missing.json").string(), "calibration file")),
             Catch::Contains("does not exist"));
  const fs::path big = scratch("big.json");
  std::ofstream(big) << std::string(2000, ' ');
  CHECK_THAT(error_of(read_input_file(big.string(), "calibration file", 1000)),
             Catch::Contains("is 1.95 KiB; the most meshtrain reads is 1000.00 B"));
  CHECK(read_input_file(big.string(), "calibration file").value().size() == 2000);
  CHECK_THAT(error_of(load_json_file(big.string(), "plan file")), Catch::Contains("plan file '" + big.string() + "' is not valid JSON"));
}

TEST_CASE("outputs are probed before long work, with the OS's reason", "[reliability][input]") {
  const fs::path out = scratch("out.json");
  REQUIRE(probe_output_file(out.string(), "--out calibration file").ok());
  CHECK_FALSE(fs::exists(out));  // created and removed again
  CHECK_THAT(error_of(Result<int>(probe_output_file("/nonexistent-dir/out.json", "--out calibration file").error())),
             Catch::Contains("cannot write --out calibration file '/nonexistent-dir/out.json': No such file or directory"));
}

TEST_CASE("host memory: a request beyond the machine is refused with both figures", "[reliability][input]") {
  CHECK(host_memory_bytes() > 1e8);
  CHECK(check_host_memory(1e6, "x", "y").ok());
  auto s = check_host_memory(1e18, "training model 'm'", "use a smaller model");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("training model 'm' needs about 888.18 PiB, but this machine has") &&
                                      Catch::Contains("of memory; use a smaller model"));
}

TEST_CASE("an output is replaced whole or not at all", "[reliability][input]") {
  const fs::path p = scratch("replaced.json");
  std::ofstream(p) << "old contents\n";
  REQUIRE(write_output_file(p.string(), "new contents\n", "test output").ok());
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  CHECK(line == "new contents");
  // Nothing is left beside it: the temporary was renamed onto it.
  int beside = 0;
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    if (e.path().filename().string().starts_with("replaced.json")) ++beside;
  CHECK(beside == 1);
  // A write that cannot finish (its temporary's name is taken by a folder)
  // fails with the reason and leaves the old file as it was.
  fs::create_directory(p.string() + ".tmp-" + std::to_string(::getpid()));
  const Status s = write_output_file(p.string(), "newer contents\n", "test output");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("test output"));
  std::ifstream again(p);
  std::getline(again, line);
  CHECK(line == "new contents");
  fs::remove(p.string() + ".tmp-" + std::to_string(::getpid()));
  const Status empty = write_output_file("", "x", "test output");
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(empty.error().message(), Catch::Contains("empty"));
}
