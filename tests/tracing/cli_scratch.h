// Scratch files for the CLI tests of this folder: a per-process directory
// under the system temp dir, a small deterministic training text, and a JSON
// file a run wrote, read back.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/training/temp_dir.h"

namespace meshtrain::testing {

inline std::filesystem::path trace_scratch(const std::string& name) { return scratch_path("trace-test", name); }

// 20 KB of text: enough for the tiny model's sequences and a held-out tail.
inline std::string training_text() {
  static const std::string path = [] {
    auto p = trace_scratch("data.txt");
    std::ofstream out(p, std::ios::binary);
    for (int i = 0; i < 400; ++i) out << "line " << i << ": the quick brown fox jumps over the lazy dog\n";
    return p.string();
  }();
  return path;
}

// The JSON file at p, which must exist; invalid JSON throws (fails the test).
inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace meshtrain::testing
