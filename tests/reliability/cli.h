// Helpers of the reliability CLI tests: scratch paths, a training text, and
// runs of the built meshtrain (under a timeout: a hang fails the test).
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"

namespace meshtrain::testing {

namespace fs = std::filesystem;

inline fs::path scratch(const std::string& name) { return scratch_path("reliability", name); }

inline std::string write_text(const std::string& name, const std::string& text) {
  const fs::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// 20 KB of text: the tiny model's sequences and a held-out tail.
inline std::string training_text() {
  static const std::string path = [] {
    std::string text;
    for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog\n";
    return write_text("data.txt", text);
  }();
  return path;
}

// A tiny training run's flags: milliseconds a step.
inline std::string tiny_train(const std::string& data = training_text()) {
  return "train --data " + data + " --model tiny --seq-len 16 --micro-batch 2 --quiet";
}

// Runs a shell command line (sh -c), output and exit status as run_meshtrain.
inline MeshtrainRun run_shell(const std::string& command) {
  FILE* f = popen(("(" + command + ") 2>&1").c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int status = pclose(f);
  return {WEXITSTATUS(status), out};
}

// Runs meshtrain and expects it to fail (non-zero, no signal) with `message` in its output.
inline void expect_refusal(const std::string& args, const std::string& message) {
  INFO("meshtrain " << args);
  const MeshtrainRun r = run_meshtrain(args);
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.status < 128);  // an error, not a crash by signal (or the timeout's 124 on a hang)
  CHECK(r.status != 124);
  CHECK_THAT(r.out, Catch::Contains(message));
}

}  // namespace meshtrain::testing
