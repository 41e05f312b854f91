// What the calibrate tests that run the built program share: a calibration
// measured by `meshtrain calibrate --backend cpu`, read back.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <utility>

#include "simulator/calibration.h"
#include "tests/run_meshtrain.h"

namespace meshtrain::testing {

struct CpuCalibration {
  MeshtrainRun run;              // calibrate's own run (its output)
  sim::Calibration calibration;  // the file it wrote
};

// `meshtrain calibrate --backend cpu --out path args` succeeds and writes a
// calibration that loads. The file stays where it is: the caller removes it.
inline CpuCalibration calibrate_cpu(const std::string& path, const std::string& args) {
  MeshtrainRun r = run_meshtrain("calibrate --backend cpu --out " + path + " " + args);
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto c = sim::load_calibration(path);
  REQUIRE(c.ok());
  return {std::move(r), std::move(c).value()};
}

}  // namespace meshtrain::testing
