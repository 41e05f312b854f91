// What the schedule tests share: a built schedule or a check that must
// succeed, failing the test with the builder's message otherwise.
#pragma once

#include <catch2/catch.hpp>

#include <utility>

#include "core/status.h"
#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

inline Schedule must(Result<Schedule> r) {
  if (!r.ok()) FAIL(r.error().message());
  return std::move(r).value();
}

inline void require_ok(const Status& st) {
  if (!st.ok()) FAIL(st.error().message());
}

}  // namespace meshtrain::schedule
