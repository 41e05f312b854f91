// Scratch files for the CLI tests of this folder: a per-process directory
// under the system temp dir and a small deterministic training text.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace meshtrain::testing {

inline std::filesystem::path trace_scratch(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("meshtrain-trace-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  fs::remove_all(p);
  return p;
}

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

}  // namespace meshtrain::testing
