// The watchdog's bookkeeping with fake completions and a fake clock.
#include <catch2/catch.hpp>

#include "backends/cuda/watchdog.h"

using namespace meshtrain::cuda;
using std::chrono::milliseconds;

namespace {
const Watchdog::AsyncError healthy = [](int) { return std::optional<std::string>(); };
}

TEST_CASE("finished ops are dropped and nothing is reported") {
  Watchdog w(3, milliseconds(1000));
  const auto t0 = Clock::now();
  bool done = false;
  w.track("all_reduce of 16 f32", 2, "0,1,2,3", t0, [&] { return done; });
  CHECK_FALSE(w.poll(t0 + milliseconds(10), healthy).has_value());
  CHECK(w.in_flight() == 1);
  done = true;
  CHECK_FALSE(w.poll(t0 + milliseconds(5000), healthy).has_value());
  CHECK(w.in_flight() == 0);
}

TEST_CASE("an op past the timeout is reported with rank, group, op and peers") {
  Watchdog w(3, milliseconds(1000));
  const auto t0 = Clock::now();
  w.track("all_gather", 9, "2,3", t0, [] { return false; });
  CHECK_FALSE(w.poll(t0 + milliseconds(999), healthy).has_value());
  auto e = w.poll(t0 + milliseconds(1500), healthy);
  REQUIRE(e.has_value());
  CHECK_THAT(e->message(), Catch::Contains("rank 3") && Catch::Contains("all_gather") &&
                               Catch::Contains("group 9") && Catch::Contains("ranks 2,3") &&
                               Catch::Contains("timed out"));
}

TEST_CASE("a communicator's async error wins over timeouts") {
  Watchdog w(0, milliseconds(10));
  const auto t0 = Clock::now();
  w.track("send to rank 1 tag 4", -1, "0,1", t0, [] { return false; });
  w.track("broadcast", 5, "0,1,2", t0, [] { return false; });
  auto e = w.poll(t0 + milliseconds(100), [](int group) {
    return group == 5 ? std::optional<std::string>("remote process exited") : std::nullopt;
  });
  REQUIRE(e.has_value());
  CHECK_THAT(e->message(), Catch::Contains("broadcast") && Catch::Contains("remote process exited"));
}
