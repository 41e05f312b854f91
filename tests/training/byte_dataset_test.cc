#include "engine/data/byte_dataset.h"

#include <catch2/catch.hpp>

#include "error_of.h"
#include "temp_dir.h"

using namespace meshtrain;
using meshtrain::testing::error_of;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_file;

namespace {
std::string load_error(const std::string& path, int seq_len) {
  return error_of(load_byte_dataset(path, seq_len));
}
}  // namespace

TEST_CASE("bad data files are refused naming the file and the fix", "[dataset]") {
  TempDir tmp;
  const std::string missing = tmp / "missing.txt";
  CHECK_THAT(load_error(missing, 8),
             Catch::Contains("'" + missing + "' does not exist") && Catch::Contains("--data"));
  CHECK_THAT(load_error(tmp.path().string(), 8), Catch::Contains("is not a regular file"));

  const std::string empty = tmp / "empty.txt";
  write_file(empty, "");
  CHECK_THAT(load_error(empty, 8), Catch::Contains("'" + empty + "' is empty"));

  // 2·(8+1) = 18 bytes are the least --seq-len 8 accepts; 17 is one short.
  const std::string short_file = tmp / "short.txt";
  write_file(short_file, std::string(17, 'a'));
  CHECK_THAT(load_error(short_file, 8),
             Catch::Contains("has 17 bytes, but --seq-len 8 needs at least 18 bytes"));
  write_file(short_file, std::string(18, 'a'));
  CHECK(load_byte_dataset(short_file, 8).ok());
}

TEST_CASE("the last 10% of the file, at least one sequence, is held out", "[dataset]") {
  TempDir tmp;
  const std::string path = tmp / "data.bin";
  std::string bytes(1000, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 % 256);
  write_file(path, bytes);

  auto d = load_byte_dataset(path, 16);
  REQUIRE(d.ok());
  CHECK(d->bytes.size() == 1000);
  CHECK(d->val().size() == 100);
  CHECK(d->train().size() == 900);
  // The splits are the file's bytes in order: train first, validation last.
  CHECK(d->train()[0] == 0);
  CHECK(d->val()[0] == static_cast<std::uint8_t>(900 * 7 % 256));
  CHECK(d->val().back() == static_cast<std::uint8_t>(999 * 7 % 256));

  // With T = 199 a tenth (100 bytes) is less than one sequence (200 bytes).
  auto long_seq = load_byte_dataset(path, 199);
  REQUIRE(long_seq.ok());
  CHECK(long_seq->val().size() == 200);
  CHECK(long_seq->train().size() == 800);

  // A copy keeps its own view of its own bytes.
  ByteDataset copy = *d;
  d->bytes.assign(d->bytes.size(), 0xff);
  CHECK(copy.val()[0] == static_cast<std::uint8_t>(900 * 7 % 256));
}
