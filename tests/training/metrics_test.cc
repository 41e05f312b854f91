#include "engine/training/metrics.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "temp_dir.h"

using namespace meshtrain;
using meshtrain::testing::read_file;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_file;

TEST_CASE("metrics are appended one JSON object per line", "[metrics]") {
  TempDir tmp;
  const std::string path = tmp / "metrics.jsonl";
  {
    auto w = MetricsWriter::open(path);
    REQUIRE(w.ok());
    REQUIRE(w->write({.step = 1,
                      .loss = 5.5,
                      .lr = 1e-4,
                      .step_time_s = 0.25,
                      .tokens_per_s = 1024,
                      .val_loss = {}})
                .ok());
    REQUIRE(w->write({.step = 2,
                      .loss = 5.25,
                      .lr = 2e-4,
                      .step_time_s = 0.5,
                      .tokens_per_s = 512,
                      .val_loss = 5.75})
                .ok());
    // Flushed per line: readable while the writer is still open.
    CHECK(read_file(path).size() > 0);
  }
  {
    // A resumed run appends to the same file.
    auto w = MetricsWriter::open(path);
    REQUIRE(w.ok());
    REQUIRE(w->write({.step = 3,
                      .loss = NAN,
                      .lr = 3e-4,
                      .step_time_s = 1,
                      .tokens_per_s = 256,
                      .val_loss = {}})
                .ok());
  }
  std::istringstream lines(read_file(path));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == nlohmann::json{{"step", 1},
                                  {"loss", 5.5},
                                  {"lr", 1e-4},
                                  {"step_time_s", 0.25},
                                  {"tokens_per_s", 1024.0}});
  CHECK(rows[1]["val_loss"] == 5.75);
  CHECK_FALSE(rows[0].contains("val_loss"));
  CHECK(rows[2]["step"] == 3);
  CHECK(rows[2]["loss"].is_null());  // NaN has no JSON spelling
}

TEST_CASE("a metrics file that cannot be opened is an error naming it", "[metrics]") {
  TempDir tmp;
  const std::string file = tmp / "plain";
  write_file(file, "");
  auto w = MetricsWriter::open(file + "/metrics.jsonl");
  REQUIRE_FALSE(w.ok());
  CHECK_THAT(w.error().message(),
             Catch::Contains("cannot write --metrics file '" + file + "/metrics.jsonl': Not a directory"));
}

TEST_CASE("the progress line shows step, loss, throughput, elapsed and ETA", "[metrics]") {
  // 10 of 100 steps in 62 s: 6.2 s a step, 90 left = 558 s = 00:09:18.
  CHECK(format_progress(10, 100, 3.45678, 8192.4, 62) ==
        "step 10/100 | loss 3.4568 | 8192 tok/s | elapsed 00:01:02 | eta 00:09:18");
  CHECK_THAT(format_progress(0, 100, 5.5, 0, 0), Catch::EndsWith("eta --:--:--"));
  CHECK(format_hms(3600 * 123 + 61) == "123:01:01");
  CHECK(format_hms(-5) == "00:00:00");
}
