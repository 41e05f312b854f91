// What the simulator's tests share: a cluster (of a preset; dgx-h100 by
// default), a stream, a stream's report.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "simulator/executor.h"

namespace meshtrain::sim::testing {

inline Cluster make(const std::string& preset, int gpus) {
  auto c = Cluster::build(*cluster_preset(preset), gpus);
  REQUIRE(c.ok());
  return std::move(c).value();
}

inline Cluster make(int gpus) { return make("dgx-h100", gpus); }

inline StreamId st(Executor& e, int dev, const char* name) {
  auto s = e.stream(dev, name);
  REQUIRE(s.ok());
  return *s;
}

inline const StreamReport& report_of(const RunReport& r, int dev, const std::string& name) {
  for (const auto& s : r.streams)
    if (s.device == dev && s.stream == name) return s;
  FAIL("no stream " << name << " on device " << dev);
  return r.streams.front();
}

}  // namespace meshtrain::sim::testing
