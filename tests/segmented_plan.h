// A plan made of segments for a test: `base` refined by the plan file's
// "segments" list, resolved on the model as `meshtrain train --plan` does and
// checked valid (the test fails with the library's message otherwise).
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>

#include "engine/plan/plan.h"
#include "engine/plan/segment_plan.h"
#include "models/model_spec.h"

namespace meshtrain::testing {

inline Plan segmented(const ModelSpec& m, Plan base, const char* segments) {
  if (m.vision()) base.seq_len = 0;
  auto parsed = segments_from_json(nlohmann::json::parse(segments), m, base);
  INFO((parsed.ok() ? std::string() : parsed.error().message()));
  REQUIRE(parsed.ok());
  base.segments = *parsed;
  const Status valid = validate_plan(base, m);
  INFO((valid.ok() ? std::string() : valid.error().message()));
  REQUIRE(valid.ok());
  return base;
}

}  // namespace meshtrain::testing
