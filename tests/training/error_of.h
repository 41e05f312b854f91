// error_of(result): the message of a Result that must have failed; the test
// fails (rather than throwing from value access) when it succeeded.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "core/status.h"

namespace meshtrain::testing {

template <class T>
std::string error_of(const Result<T>& r) {
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

}  // namespace meshtrain::testing
