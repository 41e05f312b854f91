// GPU selection from the launcher's local rank (reading it is tested in
// tests/comm/test_launch.cc).
#include <catch2/catch.hpp>

#include "backends/cuda/device_select.h"

using namespace meshtrain::cuda;

TEST_CASE("the device is the local rank among the visible devices") {
  CHECK(*select_device(5, 8) == 5);
  CHECK(*select_device(std::nullopt, 8) == 0);
  CHECK(*select_device(5, 1) == 0);  // CUDA_VISIBLE_DEVICES bound one GPU per rank
  auto over = select_device(8, 8);
  REQUIRE_FALSE(over.ok());
  CHECK_THAT(over.error().message(), Catch::Contains("local rank 8") && Catch::Contains("8 devices"));
  REQUIRE_FALSE(select_device(0, 0).ok());
}
