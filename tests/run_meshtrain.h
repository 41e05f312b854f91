// Runs the built meshtrain executable (MESHTRAIN_BIN, set by the test's CMake)
// with arguments, capturing stdout and stderr together and the exit status.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

struct MeshtrainRun {
  int status;
  std::string out;
};

inline MeshtrainRun run_meshtrain(const std::string& args) {
  std::string cmd = std::string(MESHTRAIN_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  int status = pclose(f);
  return {WEXITSTATUS(status), out};
}

// `meshtrain args` is refused: exit status 1, and its output says `says`.
inline void check_refused(const std::string& args, const std::string& says) {
  const MeshtrainRun r = run_meshtrain(args);
  INFO(args << "\n" << r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains(says));
}
