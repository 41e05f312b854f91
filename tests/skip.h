// A test whose input is not installed on this machine (a Debian package that
// setup.sh installs) skips itself with MT_SKIP_MISSING(path, package): it
// prints "SKIPPED: missing PATH; apt-get install PACKAGE" on stdout, which
// meshtrain_test (tests/CMakeLists.txt) gives CTest as the test's
// SKIP_REGULAR_EXPRESSION, so the run reports it Skipped and not Passed.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#define MT_SKIP_MISSING(path, package)                                                              \
  do {                                                                                              \
    const std::string mt_skip_line = std::string("SKIPPED: missing ") + (path) + "; apt-get install " + \
                                     (package);                                                     \
    WARN(mt_skip_line);                                                                             \
    std::puts(mt_skip_line.c_str());                                                                \
    std::fflush(stdout);                                                                            \
    return;                                                                                         \
  } while (0)
