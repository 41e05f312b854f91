// The check most error tests make: a Result or Status failed, and its
// message names the fault.
#pragma once

#include <catch2/catch.hpp>

#include <string>

namespace meshtrain::testing {

// r failed, with a message containing says.
template <class R>
void check_fails_with(const R& r, const std::string& says) {
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message(), Catch::Contains(says));
}

}  // namespace meshtrain::testing
